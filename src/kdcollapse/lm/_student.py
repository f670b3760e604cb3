"""Students built from the teacher by depth pruning: a subset of the teacher's decoder layers, in order, with the
teacher's embeddings, final norm and output head copied (every weight of a kept layer copied as it is).

Which layers (``StudentInit.layers``):

- ``distilbert``: ``keep`` layers spread evenly over the teacher's ``n``, the first and the last kept: layer
  ``floor(i (n - 1) / (keep - 1) + 1/2)`` for i = 0 … keep - 1 (``keep`` defaults to n // 2, "one layer out of two",
  Sanh et al. 2019). For 12 → 6 this is [0, 2, 4, 7, 9, 11], the list of DistilBERT's own extraction script
  (huggingface/transformers, ``examples/research_projects/distillation/scripts/extract_distilbert.py``).
- ``minitron``: drop the contiguous block of ``n - keep`` layers that changes the hidden state least on calibration
  tokens (Muralidharan et al. 2024, "Compact Language Models via Pruning and Knowledge Distillation", depth
  pruning; the block score of Gromov et al. 2024 and ShortGPT's block importance, Men et al. 2024). The block
  [s, s + m) scores ``1 - mean_t cos(h_s[t], h_{s+m}[t])``: h_ℓ is the residual stream entering layer ℓ and
  h_n the last layer's output before the final norm, the mean over every counted calibration token. The
  lowest-scoring block (the first on a tie) is dropped.
- ``all``: every layer (the default when ``width`` is given).
- a list of layer indices (strictly increasing, each in [0, n)): exactly those.

``width: {hidden_size, intermediate_size, num_attention_heads}`` then prunes the kept layers' width by Minitron's
activation importance on the same calibration blocks (:mod:`kdcollapse.lm._width`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from kdcollapse._optional import require
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.lm._width import WIDTH_KEYS

STRATEGIES = ("distilbert", "minitron", "all")


@dataclass(frozen=True)
class StudentInit:
    """The ``init`` of a student built from the teacher: ``{from: teacher, layers: distilbert | minitron | all |
    [...], keep: N, calibration_blocks: B, width: {hidden_size: H, intermediate_size: I, num_attention_heads: A}}``
    (module doc)."""

    layers: str | tuple[int, ...] = "distilbert"
    keep: int | None = None  # layers kept by distilbert / minitron (default: half the teacher's, rounded down)
    calibration_blocks: int = 32  # minitron and width: training blocks the scores are measured on
    width: tuple[tuple[str, int], ...] | None = None  # width pruning's target sizes (key, value), sorted by key

    @classmethod
    def from_mapping(cls, spec: Mapping[str, Any]) -> StudentInit:
        """``spec`` checked (before any model loads): ``from: teacher`` and the keys above, each a one-line
        :class:`~kdcollapse.errors.ConfigError` naming the bad value and the valid choices."""
        if not isinstance(spec, Mapping):
            raise ConfigError(f"student.init must be a mapping such as {{from: teacher, layers: distilbert}}, got "
                              f"{spec!r}")
        options = dict(spec)
        source = options.pop("from", None)
        if source != "teacher":
            raise ConfigError(f"student.init.from must be 'teacher' (a student built from the teacher's layers), got "
                              f"{source!r}; for a random student leave out student.init")
        unknown = sorted(set(options) - {"layers", "keep", "calibration_blocks", "width"})
        if unknown:
            raise ConfigError(f"unknown keys in student.init: {', '.join(unknown)} (valid: from, layers, keep, "
                              f"calibration_blocks, width)")
        width = _width_of(options.get("width"))
        layers = options.get("layers", "distilbert" if width is None else "all")
        if isinstance(layers, (list, tuple)):
            if not layers or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in layers) \
                    or list(layers) != sorted(set(layers)):
                raise ConfigError(f"student.init.layers as a list must be strictly increasing layer indices >= 0, got "
                                  f"{list(layers)!r}")
            layers = tuple(layers)
            if "keep" in options:
                raise ConfigError("student.init.keep goes with layers: distilbert or minitron, not a layer list")
        elif layers not in STRATEGIES:
            raise ConfigError(f"student.init.layers must be one of {', '.join(STRATEGIES)} or a list of layer indices, "
                              f"got {layers!r}")
        keep = options.get("keep")
        if keep is not None and not (isinstance(keep, int) and not isinstance(keep, bool) and keep >= 1):
            raise ConfigError(f"student.init.keep must be an int >= 1, got {keep!r}")
        blocks = options.get("calibration_blocks", 32)
        if not (isinstance(blocks, int) and not isinstance(blocks, bool) and blocks >= 1):
            raise ConfigError(f"student.init.calibration_blocks must be an int >= 1, got {blocks!r}")
        if layers == "all" and "keep" in options:
            raise ConfigError("student.init.keep goes with layers: distilbert or minitron, not layers: all")
        return cls(layers, keep, blocks, width)


def _width_of(width: Any) -> tuple[tuple[str, int], ...] | None:
    if width is None:
        return None
    if not isinstance(width, Mapping) or not width:
        raise ConfigError(f"student.init.width must be a mapping of {', '.join(WIDTH_KEYS)} to sizes, got {width!r}")
    unknown = sorted(set(width) - set(WIDTH_KEYS))
    if unknown:
        raise ConfigError(f"unknown keys in student.init.width: {', '.join(unknown)} (valid: {', '.join(WIDTH_KEYS)})")
    for key, value in width.items():
        if not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
            raise ConfigError(f"student.init.width.{key} must be an int >= 1, got {value!r}")
    return tuple(sorted(width.items()))


def check_student_section(student: Mapping[str, Any]) -> StudentInit | None:
    """A run's ``student`` mapping checked before any model loads: ``{init: {from: teacher, ...}}`` (nothing else:
    the architecture is the teacher's) gives its :class:`StudentInit`; otherwise it is a ``transformers`` config
    (checked by :func:`~kdcollapse.lm.language_model_config`, with no stand-in vocabulary, so no warning about
    special-token ids outside it) and None is returned."""
    from kdcollapse.lm._load import language_model_config
    if not isinstance(student, Mapping):
        raise ConfigError(f"'student' must be a mapping (a transformers config or {{init: {{from: teacher}}}}), got "
                          f"{student!r}")
    if "init" in student:
        others = sorted(set(student) - {"init"})
        if others:
            raise ConfigError(f"student.init builds the student from the teacher's own architecture: remove "
                              f"student.{', student.'.join(others)} (or student.init for a random student)")
        return StudentInit.from_mapping(student["init"])
    try:
        language_model_config(student)
    except KdcollapseError as err:
        raise ConfigError(f"student: {err}") from None
    return None


def decoder_layers(model: Any) -> tuple[str, nn.ModuleList]:
    """The name and the ``ModuleList`` of ``model``'s decoder layers (the one list of ``num_hidden_layers``
    modules: ``model.layers`` for Llama/Qwen/Mistral, ``transformer.h`` for GPT-2)."""
    n = model.config.num_hidden_layers
    found = [(name, m) for name, m in model.named_modules() if isinstance(m, nn.ModuleList) and len(m) == n]
    if len(found) != 1:
        raise KdcollapseError(f"cannot tell the decoder layers of this {type(model).__name__}: "
                              f"{len(found)} module lists of {n} modules")
    return found[0]


def distilbert_layers(n: int, keep: int | None = None) -> list[int]:
    """``keep`` of ``n`` layers, evenly spread, first and last kept (module doc)."""
    keep = max(1, n // 2) if keep is None else keep
    _check_keep(n, keep)
    if keep == 1:
        return [0]
    return [math.floor(i * (n - 1) / (keep - 1) + 0.5) for i in range(keep)]


def _check_keep(n: int, keep: int) -> None:
    if not 1 <= keep <= n:
        raise KdcollapseError(f"student.init.keep={keep}: the teacher has {n} layers, so keep must be in [1, {n}]")


@torch.no_grad()
def block_importance(model: Any, blocks: torch.Tensor, size: int, *, mask: torch.Tensor | None = None,
                     batch_size: int = 8) -> torch.Tensor:
    """(n - size + 1,) the score ``1 - mean cos(h_s, h_{s+size})`` of every contiguous block of ``size`` layers
    (module doc) on the token ``blocks`` (B, T); ``mask`` (B, T) bool picks the tokens averaged over (default
    all)."""
    _, layers = decoder_layers(model)
    n = len(layers)
    if not 1 <= size < n:
        raise KdcollapseError(f"a block to drop has 1 to {n - 1} of the teacher's {n} layers, got {size}")
    mask = torch.ones(blocks.shape, dtype=torch.bool) if mask is None else mask.bool()
    states: list[torch.Tensor | None] = [None] * (n + 1)

    def entering(index):
        def hook(module, args, kwargs):
            states[index] = args[0] if args else kwargs["hidden_states"]
        return hook

    def leaving(module, args, kwargs, output):
        states[n] = output[0] if isinstance(output, tuple) else output

    handles = [layer.register_forward_pre_hook(entering(i), with_kwargs=True) for i, layer in enumerate(layers)]
    handles.append(layers[-1].register_forward_hook(leaving, with_kwargs=True))
    total = torch.zeros(n - size + 1, dtype=torch.float64)
    count = 0
    was_training = model.training
    model.eval()
    try:
        for ids, keep in zip(blocks.split(batch_size), mask.split(batch_size)):
            model(ids, use_cache=False)
            for s in range(n - size + 1):
                cos = torch.nn.functional.cosine_similarity(states[s].double(), states[s + size].double(), dim=-1)
                total[s] += cos[keep].sum()
            count += int(keep.sum())
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if count == 0:
        raise KdcollapseError("no calibration token to score the blocks on (the mask counts none)")
    return 1 - total / count


def minitron_layers(model: Any, blocks: torch.Tensor, keep: int | None = None, *,
                    mask: torch.Tensor | None = None) -> list[int]:
    """The layers kept when the contiguous block of ``n - keep`` layers scoring lowest is dropped (module doc)."""
    n = model.config.num_hidden_layers
    keep = max(1, n // 2) if keep is None else keep
    _check_keep(n, keep)
    if keep == n:
        return list(range(n))
    size = n - keep
    start = int(torch.argmin(block_importance(model, blocks, size, mask=mask)))
    return [i for i in range(n) if not start <= i < start + size]


def select_layers(model: Any, init: StudentInit, calibration: torch.Tensor | None = None, *,
                  mask: torch.Tensor | None = None) -> list[int]:
    """The teacher layers ``init`` keeps (``calibration`` (B, T) token blocks for ``minitron``)."""
    n = model.config.num_hidden_layers
    if isinstance(init.layers, tuple):
        if init.layers[-1] >= n:
            raise KdcollapseError(f"student.init.layers {list(init.layers)}: the teacher has {n} layers (0 to {n - 1})")
        return list(init.layers)
    if init.layers == "distilbert":
        return distilbert_layers(n, init.keep)
    if init.layers == "all":
        return list(range(n))
    if calibration is None:
        raise KdcollapseError("student.init.layers=minitron scores the teacher's blocks on calibration tokens: give "
                              "them")
    return minitron_layers(model, calibration[:init.calibration_blocks], init.keep,
                           mask=None if mask is None else mask[:init.calibration_blocks])


def student_from_teacher(teacher: Any, layers: Sequence[int]) -> Any:
    """A new model of the teacher's architecture with ``len(layers)`` decoder layers, layer j a copy of teacher
    layer ``layers[j]``, every other weight (embeddings, final norm, head) copied; in eval mode, in the teacher's
    dtype. The teacher is left as it was."""
    transformers = require("transformers", "language models")
    prefix, modules = decoder_layers(teacher)
    n = len(modules)
    layers = list(layers)
    if not layers or layers != sorted(set(layers)) or layers[0] < 0 or layers[-1] >= n:
        raise KdcollapseError(f"layers {layers} must be strictly increasing indices of the teacher's {n} layers")
    config = teacher.config.__class__.from_dict(teacher.config.to_dict())
    config.num_hidden_layers = len(layers)
    if isinstance(getattr(config, "layer_types", None), list) and len(config.layer_types) == n:
        config.layer_types = [config.layer_types[i] for i in layers]  # per-layer attention kinds (sliding/full)
    with torch.random.fork_rng(devices=[]):  # the initial weights are all overwritten; keep the caller's RNG
        student = transformers.AutoModelForCausalLM.from_config(config)
    renamed = {}
    position = {teacher_index: j for j, teacher_index in enumerate(layers)}
    for key, value in teacher.state_dict().items():
        if key.startswith(prefix + "."):
            index, rest = key[len(prefix) + 1:].split(".", 1)
            if int(index) not in position:
                continue
            key = f"{prefix}.{position[int(index)]}.{rest}"
        renamed[key] = value
    # loaded in the teacher's dtype: a float64 teacher's weights are not rounded through float32 on the way
    student.to(next(teacher.parameters()).dtype).load_state_dict(renamed, strict=True)
    return student.eval()
