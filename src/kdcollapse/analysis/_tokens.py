r"""Collapse of a causal language model's next-token classes, layer by layer (Wu & Papyan 2024).

The feature at position t of a layer is that layer's hidden state at t; its class is the token at t + 1.
Positions are kept exactly as the LLM losses keep them (``kdcollapse.losses.shift_for_causal_lm``): the
next token must be attended and labelled (not ``ignore_index``); without explicit ``labels`` the padding
(``attention_mask == 0``) is unlabelled.

**Classes.** A first pass over the token ids alone (no model) counts every vocabulary entry as a next
token. Entries seen fewer than ``min_count`` times are excluded: their positions are dropped from every
statistic and the kept entries are renumbered 0..K'-1 in vocabulary order (a class needs one sample for
its mean and two for a within-class spread, so ``min_count`` >= 1; default 2). The counts of every entry
and what was excluded are part of the report.

**Passes.** One model pass accumulates a :class:`~kdcollapse.metrics.FeatureStatistics` per chosen layer
from ``output_hidden_states`` (memory: the K' x d and d x d states per layer, plus one batch of hidden
states). NC4 needs the class means before it can classify: the statistics pass also keeps the kept
positions' hidden states of the chosen layers (in the model's dtype) and the network's predicted class,
batch by batch (:class:`NccCache`), when they fit in ``ncc_cache_bytes`` (default 2 GiB; the size is known
before the pass, from the counts: positions x chosen layers x d x element size), and
:class:`~kdcollapse.metrics.NearestClassMeanAccuracy` classifies them once the means are known. When they
do not fit, a second model pass recomputes them, and memory does not grow with the number of tokens; the
result records which ran (``"ncc_features"``). Both give the same answers bit for bit on a deterministic
device: the same values (the model's hidden states, widened to float32 only at use, as the second pass
widens them) in the same batches (``ncc=False`` skips NC4). The network's prediction is the argmax of its
logits over the kept classes.
The classifier metrics (NC3, GNC2, GNC3, NC2 of W) use the output embedding's kept rows and are computed
for the last hidden state only, the features that classifier reads.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn
from tqdm import tqdm

from kdcollapse._optional import available
from kdcollapse.analysis._plots import plot_token_layers
from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import IGNORE_INDEX
from kdcollapse.runs import write_text
from kdcollapse.metrics import FeatureStatistics, NearestClassMeanAccuracy, accumulation_dtype, collapse_metrics

Batch = Mapping[str, Tensor]  # input_ids (B, T), optional attention_mask (B, T) and labels (B, T)

# analyze_tokens' default memory for NC4's features kept from the statistics pass (NccCache): 2 GiB.
NCC_CACHE_BYTES = 2 * 2**30


@dataclass(frozen=True)
class TokenClasses:
    """Next-token counts of a corpus and the classes kept by ``min_count``."""

    counts: Tensor  # (V,) int64: how often each vocabulary entry is a kept next token
    min_count: int
    kept: Tensor  # (K',) vocabulary ids of the kept classes, ascending
    index: Tensor  # (V,) class of each vocabulary id in 0..K'-1, -1 if excluded

    @property
    def num_classes(self) -> int:
        return self.kept.numel()

    def summary(self) -> dict[str, int | float]:
        """What the exclusion rule kept and dropped (classes and tokens)."""
        counts, kept = self.counts, self.counts >= self.min_count
        tokens = int(counts.sum())
        return {
            "vocab_size": counts.numel(),
            "tokens": tokens,
            "min_count": self.min_count,
            "classes_kept": int(kept.sum()),
            "classes_never_seen": int((counts == 0).sum()),
            "classes_below_min_count": int(((counts > 0) & ~kept).sum()),
            "tokens_excluded": int(counts[~kept].sum()),
            "fraction_tokens_kept": float(counts[kept].sum()) / max(tokens, 1),
        }


def next_token_targets(batch: Batch, ignore_index: int = IGNORE_INDEX) -> tuple[Tensor, Tensor]:
    """(labels, keep), both (B, T - 1): the next token of each position and whether it counts, as
    ``shift_for_causal_lm`` decides (labelled and attended)."""
    input_ids = batch.get("input_ids")
    if not isinstance(input_ids, Tensor) or input_ids.ndim != 2 or input_ids.shape[1] < 2:
        shape = tuple(input_ids.shape) if isinstance(input_ids, Tensor) else type(input_ids).__name__
        raise KdcollapseError(f"a token batch needs input_ids of shape (B, T) with T >= 2, got {shape}")
    mask = batch.get("attention_mask")
    labels = batch.get("labels")
    if labels is None:
        labels = input_ids if mask is None else input_ids.masked_fill(mask == 0, ignore_index)
    keep = labels[:, 1:] != ignore_index
    if mask is not None:
        keep &= mask[:, 1:].bool()
    return labels[:, 1:], keep


def token_classes(batches: Iterable[Batch], vocab_size: int, *, min_count: int = 2,
                  ignore_index: int = IGNORE_INDEX) -> TokenClasses:
    """Count the next tokens of ``batches`` (no model) and keep the entries seen ``min_count`` times."""
    if not isinstance(min_count, int) or min_count < 1:
        raise KdcollapseError(f"min_count must be a positive integer, got {min_count!r}")
    counts = torch.zeros(vocab_size, dtype=torch.int64)
    for batch in batches:
        labels, keep = next_token_targets(batch, ignore_index)
        labels = labels[keep].cpu()
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= vocab_size):
            raise KdcollapseError(f"token ids must lie in [0, {vocab_size}), got {int(labels.min())}..{int(labels.max())}")
        counts += torch.bincount(labels, minlength=vocab_size)
    kept = (counts >= min_count).nonzero().flatten()
    if kept.numel() < 2:
        raise KdcollapseError(
            f"only {kept.numel()} vocabulary entries occur at least min_count={min_count} times as a next "
            f"token in {int(counts.sum())} tokens; collapse metrics need 2 classes: use more text or a "
            "smaller min_count"
        )
    index = torch.full((vocab_size,), -1, dtype=torch.int64)
    index[kept] = torch.arange(kept.numel())
    return TokenClasses(counts, min_count, kept, index)


def resolve_layers(layers: str | Sequence[int] | None, num_hidden: int) -> list[int]:
    """Hidden-state indices: None / ``"last"`` -> the last one (the classifier's input), ``"all"`` -> 0..L
    (0 is the embedding output), or explicit indices (negative ones count from the end)."""
    if layers is None or layers == "last":
        return [num_hidden - 1]
    if layers == "all":
        return list(range(num_hidden))
    if isinstance(layers, str):
        raise KdcollapseError(f"layers must be 'last', 'all' or a list of indices, got {layers!r}")
    out = []
    for layer in layers:
        if not isinstance(layer, int) or not -num_hidden <= layer < num_hidden:
            raise KdcollapseError(f"layer {layer!r} is not a hidden-state index; valid: 0..{num_hidden - 1} "
                                  f"(0 the embeddings, {num_hidden - 1} the last), or negative from the end")
        out.append(layer % num_hidden)
    return sorted(set(out))


def _forward(model: nn.Module, batch: Batch) -> tuple[tuple[Tensor, ...], Tensor]:
    device = next(model.parameters()).device
    out = model(input_ids=batch["input_ids"].to(device),
                attention_mask=None if batch.get("attention_mask") is None else batch["attention_mask"].to(device),
                output_hidden_states=True)
    return out.hidden_states, out.logits


class NccCache:
    """What NC4 needs of the statistics pass, kept batch by batch: the kept positions' hidden states of every
    chosen layer (the model's dtype, on its device), their classes and the network's predicted class (the
    argmax of the logits over the kept classes), if all of it fits in ``budget`` bytes.

    ``token_pass(..., cache=)`` fills it; ``ncc_pass(..., cache=)`` classifies from it instead of running the
    model again. The size is decided on the first batch, before anything is kept: the kept positions of all the
    batches (``TokenClasses.counts`` of the kept classes) x (the chosen layers' widths x their element size + 16
    bytes for a class and a prediction). ``state()``: what was decided, for the result."""

    def __init__(self, budget: int) -> None:
        if not isinstance(budget, int) or isinstance(budget, bool) or budget < 0:
            raise KdcollapseError(f"the NC4 cache budget must be a non-negative number of bytes, got {budget!r}")
        self.budget, self.needed, self.ready = budget, None, False
        self.batches: list[tuple[dict[int, Tensor], Tensor, Tensor]] = []

    def plan(self, positions: int, hidden: Sequence[Tensor], layers: list[int]) -> bool:
        """Whether to keep features: decided once, on the first batch's hidden states."""
        if self.needed is None:
            per_position = sum(hidden[layer].shape[-1] * hidden[layer].element_size() for layer in layers) + 16
            self.needed = positions * per_position
        return self.needed <= self.budget

    def state(self) -> dict[str, object]:
        where = "cached from the statistics pass" if self.ready else "a second model pass (over the budget)"
        return {"features": where, "bytes_needed": self.needed, "budget_bytes": self.budget}

    def drain(self) -> Iterable[tuple[dict[int, Tensor], Tensor, Tensor]]:
        """The kept batches in their order, each released once handed out."""
        self.ready = False
        self.batches.reverse()
        while self.batches:
            yield self.batches.pop()


@torch.no_grad()
def token_pass(model: nn.Module, batches: Iterable[Batch], classes: TokenClasses, layers: list[int], *,
               ignore_index: int = IGNORE_INDEX, accumulate: str = "auto", progress: bool = False,
               cache: NccCache | None = None) -> tuple[dict[int, FeatureStatistics], dict[str, float]]:
    """One pass: a ``FeatureStatistics`` of the kept positions for each hidden-state index in ``layers``,
    and the model's next-token cross-entropy over every labelled position (excluded classes included):
    ``{"cross_entropy": nats per token, "perplexity": exp of it, "tokens_scored": positions}``.
    ``accumulate`` as ``FeatureStatistics``' for every layer; ``"auto"`` decides on the class sums of all
    the layers together (float32 once their float64 total would pass ``ACCUMULATION_BOUND``). With ``cache``
    (an :class:`NccCache`), also keeps what NC4 needs if it fits in the cache's budget."""
    stats: dict[int, FeatureStatistics] = {}
    positions = int(classes.counts[classes.kept].sum())
    keeping = None
    nll, scored = torch.zeros((), dtype=torch.float64), 0
    for batch in tqdm(batches, desc="token features", disable=not progress, leave=False):
        hidden, logits = _forward(model, batch)
        labels, labelled = next_token_targets(batch, ignore_index)
        labelled = labelled.to(logits.device)
        nll += _next_token_nll(logits, labels.to(logits.device), labelled).cpu()
        scored += int(labelled.sum())
        targets, keep = _kept_targets(batch, classes, ignore_index)
        if keeping is None:
            keeping = cache is not None and cache.plan(positions, hidden, layers)
        kept: dict[int, Tensor] = {}
        for layer in layers:
            features = hidden[layer][:, :-1][keep.to(hidden[layer].device)]  # a copy, in the model's dtype
            if keeping:
                kept[layer] = features
            features = features.float()
            if layer not in stats:
                dtype = accumulation_dtype(classes.num_classes * len(layers), features.shape[1], accumulate)
                stats[layer] = FeatureStatistics(classes.num_classes, features.shape[1], sync_on_compute=False,
                                                 accumulate=str(dtype).removeprefix("torch.")).to(features.device)
            stats[layer].update(features, targets.to(features.device))
        if keeping:
            cache.batches.append((kept, targets, _network_predictions(logits, classes, keep)))
    if not stats:
        raise KdcollapseError("no token batches to analyse")
    if keeping:
        cache.ready = True
    loss = float(nll) / max(scored, 1)
    return stats, {"cross_entropy": loss, "perplexity": math.exp(loss), "tokens_scored": scored}


def _network_predictions(logits: Tensor, classes: TokenClasses, keep: Tensor) -> Tensor:
    """The network's class at the kept positions: the argmax of its logits over the kept classes (the K' kept
    columns first, then the kept positions: no (positions x V) copy of the logits)."""
    return logits[:, :-1, classes.kept.to(logits.device)][keep.to(logits.device)].argmax(dim=1)


@torch.no_grad()
def ncc_pass(model: nn.Module, batches: Iterable[Batch], classes: TokenClasses,
             stats: Mapping[int, FeatureStatistics], *, ignore_index: int = IGNORE_INDEX,
             progress: bool = False, cache: NccCache | None = None) -> dict[int, dict[str, Tensor]]:
    """NC4 (nearest-class-mean accuracy and agreement with the network) for every layer: from ``cache`` when
    ``token_pass`` filled it (emptied as it goes), else a second model pass over ``batches``."""
    metrics = {layer: NearestClassMeanAccuracy(s.class_means(), sync_on_compute=False).to(s.moment.device)
               for layer, s in stats.items()}
    if cache is not None and cache.ready:
        kept_batches = cache.drain()
    else:
        kept_batches = (_recomputed(model, batch, classes, ignore_index, list(metrics)) for batch in batches)
    for kept, targets, predictions in tqdm(kept_batches, desc="nearest class means", disable=not progress,
                                           leave=False):
        for layer, metric in metrics.items():
            features = kept[layer].float()
            metric.update(features, targets.to(features.device), predictions=predictions)
    return {layer: metric.compute() for layer, metric in metrics.items()}


def _recomputed(model: nn.Module, batch: Batch, classes: TokenClasses, ignore_index: int,
                layers: list[int]) -> tuple[dict[int, Tensor], Tensor, Tensor]:
    """What ``token_pass`` keeps of one batch (``NccCache``), from the model again."""
    hidden, logits = _forward(model, batch)
    targets, keep = _kept_targets(batch, classes, ignore_index)
    kept = {layer: hidden[layer][:, :-1][keep.to(hidden[layer].device)] for layer in layers}
    return kept, targets, _network_predictions(logits, classes, keep)


def _next_token_nll(logits: Tensor, labels: Tensor, labelled: Tensor) -> Tensor:
    """Float64 sum of the float32 next-token cross-entropies at the ``labelled`` positions of ``logits``
    (B, T, V): logsumexp minus the label's logit, as ``cross_entropy`` forms it, without its (positions x V)
    log-softmax and the boolean-indexed copy of the logits (a third of the statistics pass's cost beyond the
    forward for SmolLM2's 49,152 entries, results/benchmarks/lm_analyze.md)."""
    head = logits[:, :-1].float()
    picked = head.gather(-1, labels.clamp(min=0)[..., None])[..., 0]  # ignore_index rows are masked out below
    return (torch.logsumexp(head, -1) - picked)[labelled].double().sum()


def _kept_targets(batch: Batch, classes: TokenClasses, ignore_index: int) -> tuple[Tensor, Tensor]:
    """Class indices of the kept positions and the (B, T - 1) mask that selects them."""
    labels, keep = next_token_targets(batch, ignore_index)
    labels = labels.cpu()
    keep = keep.cpu()
    cls = classes.index[labels.clamp(0, classes.index.numel() - 1)]
    keep &= cls >= 0
    return cls[keep], keep


def token_batches(rows: Tensor, batch_size: int, max_tokens: int | None = None) -> list[dict[str, Tensor]]:
    """Batches ``{"input_ids": (B, T)}`` of the first rows of ``rows`` (e.g. ``TokenSplit.blocks(T)``)
    holding at most ``max_tokens`` tokens in all (None: every row)."""
    if not isinstance(batch_size, int) or batch_size < 1:
        raise KdcollapseError(f"batch_size must be a positive integer, got {batch_size!r}")
    if max_tokens is not None:
        if not isinstance(max_tokens, int) or max_tokens < rows.shape[1]:
            raise KdcollapseError(f"max_tokens must be at least one row of {rows.shape[1]} tokens, got {max_tokens!r}")
        rows = rows[: max_tokens // rows.shape[1]]
    return [{"input_ids": chunk} for chunk in rows.split(batch_size)]


def analyze_tokens(
    model: nn.Module,
    batches: Sequence[Batch],
    *,
    layers: str | Sequence[int] | None = None,
    min_count: int = 2,
    ignore_index: int = IGNORE_INDEX,
    ncc: bool = True,
    gnc_convention: str = "paper",
    accumulate: str = "auto",
    ncc_cache_bytes: int = NCC_CACHE_BYTES,
    out_dir: str | Path | None = None,
    progress: bool = False,
    source: str | None = None,
) -> dict:
    """Per-layer next-token collapse of a causal LM over ``batches`` (re-iterable: two or three passes).

    ``model`` is a Hugging Face-style causal LM (``model(input_ids=, attention_mask=,
    output_hidden_states=True)`` returns ``hidden_states`` and ``logits``; ``get_output_embeddings()`` the
    classifier). ``gnc_convention`` as in ``collapse_metrics``, ``accumulate`` as in ``token_pass``;
    ``source`` (where the model came from) is recorded in the result as it is given. ``ncc_cache_bytes``: the
    memory NC4's features kept from the statistics pass may take (``NccCache``; 0: always a second pass);
    ``"ncc_features"`` in the result says which ran.
    Returns ``{"classes": ..., "layers": {index: metrics}, "cross_entropy", "perplexity", "tokens_scored",
    "seconds": ...}`` (the loss over every labelled position, ``token_pass``); with ``out_dir``
    also writes ``analysis.json``, ``token_counts.json``, ``analysis.md`` and ``layers.png`` (matplotlib).
    """
    start = time.perf_counter()
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), Tensor):
        raise KdcollapseError("the model has no output embedding (get_output_embeddings()) to classify tokens")
    vocab_size = head.weight.shape[0]
    classes = token_classes(batches, vocab_size, min_count=min_count, ignore_index=ignore_index)
    num_hidden = model.config.num_hidden_layers + 1
    chosen = resolve_layers(layers, num_hidden)
    was_training = model.training
    model.eval()
    cache = NccCache(ncc_cache_bytes) if ncc else None
    try:
        stats, loss = token_pass(model, batches, classes, chosen, ignore_index=ignore_index, accumulate=accumulate,
                                 progress=progress, cache=cache)
        ncc_features = cache.state() if cache is not None else None
        nearest = ncc_pass(model, batches, classes, stats, ignore_index=ignore_index, progress=progress,
                           cache=cache) if ncc else {}
    finally:
        model.train(was_training)
    weight = head.weight.detach()[classes.kept.to(head.weight.device)]
    per_layer = {}
    for layer, s in stats.items():
        w = weight.to(s.moment.device) if layer == num_hidden - 1 else None
        values = collapse_metrics(s, w, gnc_convention=gnc_convention) | nearest.get(layer, {})
        per_layer[layer] = {k: float(v) if v.is_floating_point() else int(v) for k, v in values.items()}
    result = {"classes": classes.summary(), "layers": per_layer, "num_hidden_states": num_hidden, **loss,
              "gnc_convention": gnc_convention, "accumulate": next(iter(stats.values())).accumulate, "ncc": ncc,
              "ncc_features": ncc_features, "source": source, "parameters": sum(p.numel() for p in model.parameters()),
              "seconds": time.perf_counter() - start}
    if out_dir is not None:
        write_token_report(result, classes, Path(out_dir))
    return result


def write_token_report(result: dict, classes: TokenClasses, out_dir: Path) -> None:
    """``analysis.json``, ``token_counts.json`` (every vocabulary id with a non-zero count), ``analysis.md``
    and, with matplotlib, ``layers.png`` (metrics against depth)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    write_text(out_dir / "analysis.json", json.dumps(result, indent=1, sort_keys=True) + "\n")
    seen = (classes.counts > 0).nonzero().flatten()
    order = seen[classes.counts[seen].argsort(descending=True, stable=True)]
    pairs = [[int(i), int(classes.counts[i])] for i in order]
    write_text(out_dir / "token_counts.json", json.dumps({"min_count": classes.min_count, "id_count": pairs}) + "\n")
    keys = ("nc1", "cdnv", "vci", "gnc1", "nc2_etf_error", "ncc_accuracy", "ncc_agreement")
    scores = (f"- {k}: {result[k]}" for k in ("cross_entropy", "perplexity", "tokens_scored") if k in result)
    lines = ["# Next-token collapse per layer", "", *(f"- {k}: {v}" for k, v in result["classes"].items()), *scores, "",
             "| layer | " + " | ".join(keys) + " |", "|---" * (len(keys) + 1) + "|"]
    for layer, values in sorted(result["layers"].items()):
        lines.append(f"| {layer} | " + " | ".join(f"{values.get(k, float('nan')):.4g}" for k in keys) + " |")
    write_text(out_dir / "analysis.md", "\n".join(lines) + "\n")
    if available("matplotlib"):  # optional: the tables are the report, the figure a view of them
        plot_token_layers({"": [result]}, out_dir / "layers.png")
