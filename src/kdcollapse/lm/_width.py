"""Width pruning of a teacher into a student (Muralidharan et al. 2024, "Compact Language Models via Pruning and
Knowledge Distillation", Minitron's activation-based importance): MLP neurons, attention heads and embedding
channels ranked on calibration tokens, the least important removed, every kept weight copied as it is.

Importance, from one forward pass of the unpruned model over the calibration blocks (no gradient):

- an MLP **neuron** i of a layer: the activation entering ``down_proj`` (``act(gate) · up`` of a SwiGLU MLP);
- an attention **head**: the L2 norm (over its ``head_dim``) of the head's output entering ``o_proj``;
- an **embedding channel** c: the output of every RMSNorm (both of each layer and the final one), summed over
  the norms;

each |activation| averaged over a block's counted tokens, then the L2 norm over the blocks (the paper's
(batch: L2, sequence: mean) aggregation; NVIDIA Model Optimizer's Minitron hooks aggregate the same way). A
layer keeps its ``intermediate_size`` most important neurons; heads are kept per key-value group (the same
number in every group, its most important ones, so grouped-query attention keeps its shape and every key and
value head stays); the ``hidden_size`` most important channels are kept in every layer, the embeddings and the
head. Ties go to the lower index; kept units keep their order.

What holds exactly: removing neurons or heads gives the teacher with those units' activations set to zero
(their ``down_proj`` / ``o_proj`` columns zeroed). Removing channels changes each RMSNorm's mean over the
channels, so it gives the teacher with those channels zeroed everywhere and every RMSNorm's weight scaled by
√(H'/H) and its ε by H'/H (``tests/test_lm_width.py`` checks both). Architectures: Llama-style decoders
(Llama, Qwen2, Mistral: ``q/k/v/o_proj``, ``gate/up/down_proj``, RMSNorm).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from kdcollapse._optional import require
from kdcollapse.errors import KdcollapseError

WIDTH_KEYS = ("hidden_size", "intermediate_size", "num_attention_heads")


def _parts(model: Any) -> tuple[Any, nn.ModuleList]:
    base = getattr(model, "model", None)
    layers = getattr(base, "layers", None)
    ok = isinstance(layers, nn.ModuleList) and all(
        hasattr(layer, "self_attn") and hasattr(layer, "mlp") and all(hasattr(layer.mlp, p) for p in
                                                                     ("gate_proj", "up_proj", "down_proj"))
        for layer in layers)
    if not ok:
        raise KdcollapseError(f"width pruning needs a Llama-style decoder (q/k/v/o_proj, gate/up/down_proj); this is "
                              f"a {type(model).__name__}")
    return base, layers


def _head_dim(config: Any) -> int:
    return getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads


def check_width(config: Any, width: Mapping[str, int]) -> dict[str, int]:
    """The target widths of ``width`` against the teacher's ``config``, missing keys kept at the teacher's; a
    width above the teacher's, or heads that are not a whole number per key-value group, is an error."""
    unknown = sorted(set(width) - set(WIDTH_KEYS))
    if unknown:
        raise KdcollapseError(f"unknown keys in student.init.width: {', '.join(unknown)} (valid: {', '.join(WIDTH_KEYS)})")
    target = {key: int(width.get(key, getattr(config, key))) for key in WIDTH_KEYS}
    for key, value in target.items():
        if not 1 <= value <= getattr(config, key):
            raise KdcollapseError(f"student.init.width.{key}={value}: the teacher's is {getattr(config, key)}, so it "
                                  f"must be in [1, {getattr(config, key)}]")
    groups = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    if target["num_attention_heads"] % groups:
        raise KdcollapseError(f"student.init.width.num_attention_heads={target['num_attention_heads']}: heads are kept "
                              f"per key-value group, so it must be a multiple of the teacher's {groups} key-value heads")
    return target


@torch.no_grad()
def width_importance(model: Any, blocks: torch.Tensor, *, mask: torch.Tensor | None = None,
                     batch_size: int = 8) -> dict[str, Any]:
    """Minitron's importance (module doc) on the token ``blocks`` (B, T): ``neurons`` and ``heads``, lists of one
    (intermediate_size,) / (num_attention_heads,) tensor per layer, and ``channels`` (hidden_size,); ``mask``
    (B, T) bool picks each block's counted tokens (default all)."""
    base, layers = _parts(model)
    config = model.config
    heads, dim = config.num_attention_heads, _head_dim(config)
    mask = torch.ones(blocks.shape, dtype=torch.bool) if mask is None else mask.bool()
    sums = {("neurons", i): 0.0 for i in range(len(layers))} | {("heads", i): 0.0 for i in range(len(layers))}
    sums["channels"] = 0.0
    current: dict[str, torch.Tensor] = {}

    def add(key, x: torch.Tensor) -> None:  # (b, T, K) magnitudes -> mean over counted tokens, squared, summed
        keep = current["mask"].to(x.dtype).unsqueeze(-1)
        counted = keep.sum(1).clamp_min(1)
        mean = (x.abs().double() * keep.double()).sum(1) / counted.double()
        sums[key] = sums[key] + mean[current["rows"]].pow(2).sum(0)

    handles = []
    for i, layer in enumerate(layers):
        handles.append(layer.mlp.down_proj.register_forward_pre_hook(
            lambda m, args, i=i: add(("neurons", i), args[0])))
        handles.append(layer.self_attn.o_proj.register_forward_pre_hook(
            lambda m, args, i=i: add(("heads", i), args[0].unflatten(-1, (heads, dim)).norm(dim=-1))))
        for norm in (layer.input_layernorm, layer.post_attention_layernorm):
            handles.append(norm.register_forward_hook(lambda m, args, out: add("channels", out)))
    handles.append(base.norm.register_forward_hook(lambda m, args, out: add("channels", out)))
    was_training = model.training
    model.eval()
    try:
        for ids, keep in zip(blocks.split(batch_size), mask.split(batch_size)):
            current.update(mask=keep, rows=keep.any(1))
            model(ids, use_cache=False)
    finally:
        for handle in handles:
            handle.remove()
        model.train(was_training)
    if not bool(mask.any()):
        raise KdcollapseError("no calibration token to rank the widths on (the mask counts none)")
    return {"neurons": [sums[("neurons", i)].sqrt() for i in range(len(layers))],
            "heads": [sums[("heads", i)].sqrt() for i in range(len(layers))], "channels": sums["channels"].sqrt()}


def _top(scores: torch.Tensor, k: int) -> torch.Tensor:
    """The indices of the ``k`` largest ``scores`` (ties: the lower index), in increasing order."""
    order = sorted(range(len(scores)), key=lambda j: (-float(scores[j]), j))
    return torch.tensor(sorted(order[:k]), dtype=torch.long)


def kept_units(config: Any, importance: Mapping[str, Any], target: Mapping[str, int]) -> dict[str, Any]:
    """The indices each pruned dimension keeps: ``neurons`` and ``heads`` per layer, ``channels``."""
    groups = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    per_group, keep_per_group = config.num_attention_heads // groups, target["num_attention_heads"] // groups
    heads = [torch.cat([g * per_group + _top(scores[g * per_group:(g + 1) * per_group], keep_per_group)
                        for g in range(groups)]) for scores in importance["heads"]]
    return {"neurons": [_top(s, target["intermediate_size"]) for s in importance["neurons"]], "heads": heads,
            "channels": _top(importance["channels"], target["hidden_size"])}


def prune_width(model: Any, width: Mapping[str, int], blocks: torch.Tensor, *,
                mask: torch.Tensor | None = None) -> tuple[Any, dict[str, Any]]:
    """A new model of ``model``'s architecture at the ``width`` (``hidden_size``, ``intermediate_size``,
    ``num_attention_heads``; missing keys keep the teacher's) with the units Minitron's importance on ``blocks``
    ranks highest (module doc), and the kept indices; in eval mode, in the model's dtype; ``model`` is left as it
    was."""
    _parts(model)
    target = check_width(model.config, width)
    keep = kept_units(model.config, width_importance(model, blocks, mask=mask), target)
    return pruned_model(model, keep), keep


def pruned_model(model: Any, keep: Mapping[str, Any]) -> Any:
    """``model`` with only the ``keep`` indices (:func:`kept_units`) of its neurons, heads and channels."""
    transformers = require("transformers", "language models")
    _, layers = _parts(model)
    config = model.config
    dim = _head_dim(config)
    channels = keep["channels"]
    new = config.__class__.from_dict(config.to_dict())
    new.hidden_size, new.head_dim = len(channels), dim
    new.intermediate_size = len(keep["neurons"][0])
    new.num_attention_heads = len(keep["heads"][0])
    if len({len(n) for n in keep["neurons"]}) != 1 or len({len(h) for h in keep["heads"]}) != 1:
        raise KdcollapseError("every layer must keep the same number of neurons and of heads")
    state = {}
    for key, value in model.state_dict().items():
        state[key] = _slice(key, value, keep, channels, dim)
    with torch.random.fork_rng(devices=[]):  # every weight is overwritten; keep the caller's RNG
        student = transformers.AutoModelForCausalLM.from_config(new)
    student.to(next(model.parameters()).dtype).load_state_dict(state, strict=True)  # in the teacher's dtype: no rounding
    return student.eval()


def _slice(key: str, value: torch.Tensor, keep: Mapping[str, Any], channels: torch.Tensor, dim: int) -> torch.Tensor:
    """One tensor of the state dict cut to the kept units (rows = outputs, columns = inputs of a linear)."""
    parts = key.split(".")
    layer = int(parts[parts.index("layers") + 1]) if "layers" in parts else None
    name = parts[-2] if parts[-1] in ("weight", "bias") else parts[-1]
    is_bias = parts[-1] == "bias"
    if name in ("embed_tokens", "lm_head"):
        return value[:, channels].clone()
    if name in ("input_layernorm", "post_attention_layernorm", "norm"):
        return value[channels].clone()
    if layer is None:
        return value.clone()
    heads = (keep["heads"][layer].unsqueeze(1) * dim + torch.arange(dim)).reshape(-1)
    if name == "q_proj":
        return value[heads].clone() if is_bias else value[heads][:, channels].clone()
    if name in ("k_proj", "v_proj"):
        return value.clone() if is_bias else value[:, channels].clone()
    if name == "o_proj":
        return value[channels].clone() if is_bias else value[channels][:, heads].clone()
    if name in ("gate_proj", "up_proj"):
        rows = keep["neurons"][layer]
        return value[rows].clone() if is_bias else value[rows][:, channels].clone()
    if name == "down_proj":
        return value[channels].clone() if is_bias else value[channels][:, keep["neurons"][layer]].clone()
    if name in ("q_norm", "k_norm"):  # per-head norms (Qwen3) act on head_dim, which is kept
        return value.clone()
    raise KdcollapseError(f"width pruning does not know the tensor {key} of this model")
