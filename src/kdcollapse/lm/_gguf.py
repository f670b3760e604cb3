"""A GGUF teacher in seconds: the first load dequantises the file with ``transformers`` and caches the result as a
Hugging Face directory (``config.json``, ``model.safetensors``, the tokenizer's JSON files) keyed by the GGUF's
SHA-256; every later load verifies and reads that directory.

Cache layout (under ``cache_dir``, default ``$KDCOLLAPSE_CACHE`` or ``~/.cache/kdcollapse``):
``gguf-<first 16 hex of the GGUF's SHA-256>/`` holding the ``save_pretrained`` files and ``kdcollapse-gguf.json``,
the manifest: the format, the GGUF's full SHA-256 and, per file, its size and SHA-256. The directory is built under
a temporary name and renamed into place whole, so a crash leaves no half-written cache; a file whose bytes no longer
match the manifest (or a missing manifest) makes the cache stale, and the next load rebuilds it. Hashes are
streamed (1 MiB at a time). Nothing is pickled and no code is loaded from the cache: weights only from safetensors,
``trust_remote_code`` off, a config naming custom code (``auto_map``) refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch

from kdcollapse._optional import require
from kdcollapse.errors import KdcollapseError

_FORMAT = "kdcollapse.gguf_cache"
_VERSION = 1
MANIFEST = "kdcollapse-gguf.json"
_CHUNK = 1 << 20


def file_sha256(path: str | Path) -> str:
    """The SHA-256 of ``path``'s bytes, read 1 MiB at a time (a GGUF of gigabytes is never held in memory)."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(_CHUNK):
            digest.update(block)
    return digest.hexdigest()


def gguf_cache_path(gguf: str | Path, cache_dir: str | Path | None = None, *, sha256: str | None = None) -> Path:
    """The cache directory of the GGUF file ``gguf`` (it may not exist yet)."""
    from kdcollapse.lm._corpus import _cache_dir
    return _cache_dir(cache_dir) / f"gguf-{(sha256 or file_sha256(gguf))[:16]}"


def refuse_remote_code(directory: Path) -> None:
    """A model directory whose config or tokenizer config names its own code (``auto_map``) is refused: loading it
    would run that code."""
    for name in ("config.json", "tokenizer_config.json"):
        path = directory / name
        if not path.is_file():
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise KdcollapseError(f"{path} is not readable JSON ({err})") from None
        if isinstance(data, dict) and "auto_map" in data:
            raise KdcollapseError(f"{path} names custom code (auto_map: {sorted(data['auto_map'])}); kdcollapse "
                                  f"never runs code from a model directory: give a model of a transformers "
                                  f"architecture")


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """``transformers``' progress bars off while a model loads (its bars for a cached 135 M model are noise)."""
    logging = require("transformers", "language models").utils.logging
    enabled = logging.is_progress_bar_enabled()
    logging.disable_progress_bar()
    try:
        yield
    finally:
        if enabled:
            logging.enable_progress_bar()


def make_saveable(model: Any) -> Any:
    """Drop the GGUF loader's marks from a model loaded from a GGUF file and dequantised (its weights are plain
    tensors): without them ``save_pretrained`` writes an ordinary Hugging Face directory instead of refusing a
    "quantized" model. A model that still holds packed GGUF modules is refused."""
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is None:
        return model
    if getattr(quantizer, "packed_modules", None):
        raise KdcollapseError("this GGUF model keeps its weights packed (a GGUF matmul kernel is installed): it "
                              "cannot be saved as a Hugging Face directory")
    quantizer.remove_quantization_config(model)
    return model


def read_gguf_cache(directory: Path, sha256: str, files: tuple[str, ...] | None = None) -> bool:
    """Whether ``directory`` is a complete cache of the GGUF with this SHA-256: its manifest names that hash and
    every file listed (or only ``files``) has the size and SHA-256 the manifest records."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        if (manifest.get("format"), manifest.get("version"), manifest.get("gguf_sha256")) != (_FORMAT, _VERSION, sha256):
            return False
        for name, (size, digest) in manifest["files"].items():
            if files is not None and name not in files:
                continue
            path = directory / name
            if path.stat().st_size != size or file_sha256(path) != digest:
                return False
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False
    return files is None or all(name in manifest["files"] for name in files)


def write_gguf_cache(directory: Path, sha256: str, model: Any, tokenizer: Any) -> Path:
    """``model`` (dequantised, made saveable) and ``tokenizer`` written as ``directory``, atomically: built under a
    temporary name, the manifest last, then renamed into place (a stale directory there is replaced)."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".tmp", dir=directory.parent))
    try:
        model.save_pretrained(tmp)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        files = {p.name: [p.stat().st_size, file_sha256(p)] for p in sorted(tmp.iterdir()) if p.is_file()}
        (tmp / MANIFEST).write_text(json.dumps({"format": _FORMAT, "version": _VERSION, "gguf_sha256": sha256,
                                                "files": files}, indent=1) + "\n")
        if directory.exists():  # stale or damaged: moved aside, then removed
            stale = Path(tempfile.mkdtemp(prefix=f".{directory.name}.", suffix=".stale", dir=directory.parent))
            os.replace(directory, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        try:
            os.replace(tmp, directory)
        except OSError:  # another process put a cache there first: keep theirs
            if not read_gguf_cache(directory, sha256):
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return directory


def load_gguf(path: Path, *, dtype: torch.dtype, tokenizer: Any, cache_dir: str | Path | None, cache: bool,
              check: Callable[[Path], None]) -> tuple[Any, Any]:
    """The model and tokenizer of the GGUF file ``path``: from its cache when that is complete and intact, else
    checked by ``check`` (its header and tensor table parsed: seconds for a vocabulary of 49,152 tokens, so not
    done when the file's SHA-256 already matches an intact cache), dequantised by ``transformers`` and
    (``cache``) written to the cache for the next load."""
    transformers = require("transformers", "language models")
    sha256 = file_sha256(path) if cache else None
    directory = gguf_cache_path(path, cache_dir, sha256=sha256) if cache else None
    with quiet_transformers():
        if cache and read_gguf_cache(directory, sha256):
            model = read_cached_model(directory)
            if tokenizer is None:
                tokenizer = transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=False)
            return model.to(dtype), tokenizer
        check(path)
        model = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                                  dtype=torch.float32)
        make_saveable(model)
        own_tokenizer = transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
        if cache:
            write_gguf_cache(directory, sha256, model, own_tokenizer)
    return model.to(dtype), tokenizer if tokenizer is not None else own_tokenizer


def read_cached_model(directory: Path) -> Any:
    """The model of a cache directory: its architecture built from ``config.json`` without drawing initial weights,
    then ``model.safetensors`` copied in (every weight the file holds; the output head may be tied to the input
    embeddings instead). About the time of reading the file, where ``from_pretrained`` took several times that."""
    transformers = require("transformers", "language models")
    from safetensors.torch import load_file
    config = transformers.AutoConfig.from_pretrained(directory, trust_remote_code=False)
    with _no_init_weights(), torch.random.fork_rng(devices=[]):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    state = load_file(str(directory / "model.safetensors"))
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)  # the file's tensors, not copies
    head = set()
    if getattr(config, "tie_word_embeddings", False):  # skipping the initialisation skipped the tying too
        model.tie_weights()
        output, embedding = model.get_output_embeddings(), model.get_input_embeddings()
        if output is not None and output.weight is embedding.weight:
            head = {name for name, p in model.named_parameters(remove_duplicate=False) if p is output.weight}
    if unexpected or set(missing) - head:
        raise KdcollapseError(f"{directory / 'model.safetensors'} does not match its config.json (missing "
                              f"{sorted(set(missing) - head)[:3]}, unexpected {sorted(unexpected)[:3]})")
    return model.eval()


def _no_init_weights():
    """``transformers``' context that skips drawing initial weights (they are overwritten), where it exists."""
    for module in ("transformers.initialization", "transformers.modeling_utils"):
        try:
            return getattr(__import__(module, fromlist=["no_init_weights"]), "no_init_weights")()
        except (ImportError, AttributeError):
            continue
    return contextlib.nullcontext()


def load_gguf_tokenizer(path: Path, cache_dir: str | Path | None, check: Callable[[Path], None]) -> Any:
    """The tokenizer of the GGUF file ``path``: from its cache's tokenizer files when they are intact (the model
    files are not read), else built from the GGUF's metadata (after ``check``)."""
    transformers = require("transformers", "language models")
    sha256 = file_sha256(path)
    directory = gguf_cache_path(path, cache_dir, sha256=sha256)
    with quiet_transformers():
        if read_gguf_cache(directory, sha256, files=("tokenizer.json", "tokenizer_config.json")):
            return transformers.AutoTokenizer.from_pretrained(directory, trust_remote_code=False)
        check(path)
        return transformers.AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
