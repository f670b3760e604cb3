"""``analyze --lm STUDENT --against TEACHER``: a causal language model's next-token geometry against another's
(a distilled student against its teacher), from one pass of both over the same token batches.

The classes are the next tokens of the batches, kept by ``min_count`` as in ``analyze --lm``
(:func:`~kdcollapse.analysis.token_classes`); both models must share the vocabulary (their output embeddings have
the same rows), so a class is the same token for both. Each chosen student hidden state i is paired with the
teacher's at the nearest relative depth (``relative_pairs``: i / L_s against j / L_t, 0 the embeddings), and for
each pair :func:`~kdcollapse.metrics.geometry_alignment` compares the two models' class means (Procrustes
alignment, simplex angle) and their features position by position (``PairedFeatures``: linear CKA). The pair
of the two last hidden states also compares the output embeddings' kept rows (the classifiers). Agreement is
the fraction of kept positions where both models' argmax over the whole vocabulary is the same token, overall
and averaged over the classes. Memory: two ``FeatureStatistics`` and one ``PairedFeatures`` per pair (K' x d
and d x d states); nothing grows with the number of tokens.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from kdcollapse.analysis._stages import kept_pairs, relative_pairs
from kdcollapse.analysis._tokens import (Batch, TokenClasses, _forward, _kept_targets, resolve_layers,
                                         token_classes)
from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import IGNORE_INDEX
from kdcollapse.metrics import METRICS, FeatureStatistics, PairedFeatures, accumulation_dtype, geometry_alignment
from kdcollapse.report import markdown_table
from kdcollapse.runs import write_text

MEANINGS = {m.name: m.meaning for m in METRICS if m.source == "geometry_alignment"}


def _head_rows(model: nn.Module, who: str) -> torch.Tensor:
    head = model.get_output_embeddings()
    if head is None or not isinstance(getattr(head, "weight", None), torch.Tensor):
        raise KdcollapseError(f"the {who} has no output embedding (get_output_embeddings()) to classify tokens")
    return head.weight.detach()


@torch.no_grad()
def token_geometry_pass(student: nn.Module, teacher: nn.Module, batches: Sequence[Batch], classes: TokenClasses,
                        pairs: list[tuple[int, int]], *, ignore_index: int = IGNORE_INDEX, accumulate: str = "auto",
                        progress: bool = False) -> tuple[list, dict]:
    """One pass of both models: for each (student layer, teacher layer) of ``pairs`` the two
    ``FeatureStatistics`` and the ``PairedFeatures`` of the kept positions; and the agreement of their argmax
    tokens (``{"agreement", "agreement_class_mean", "positions"}``)."""
    states: list | None = None
    same = torch.zeros(classes.num_classes, dtype=torch.float64)
    seen = torch.zeros(classes.num_classes, dtype=torch.float64)
    for batch in tqdm(batches, desc="student and teacher tokens", disable=not progress, leave=False):
        hidden_s, logits_s = _forward(student, batch)
        hidden_t, logits_t = _forward(teacher, batch)
        targets, keep = _kept_targets(batch, classes, ignore_index)
        layers = [(hidden_s[i][:, :-1][keep.to(hidden_s[i].device)].float(),
                   hidden_t[j][:, :-1][keep.to(hidden_t[j].device)].float()) for i, j in pairs]
        if states is None:
            dtype = str(accumulation_dtype(classes.num_classes * 2 * len(pairs),
                                           max(max(a.shape[1], b.shape[1]) for a, b in layers),
                                           accumulate)).removeprefix("torch.")
            states = [(FeatureStatistics(classes.num_classes, a.shape[1], sync_on_compute=False,
                                         accumulate=dtype).to(a.device),
                       FeatureStatistics(classes.num_classes, b.shape[1], sync_on_compute=False,
                                         accumulate=dtype).to(b.device),
                       PairedFeatures(a.shape[1], b.shape[1], sync_on_compute=False).to(a.device)) for a, b in layers]
        for (a, b), (sa, sb, paired) in zip(layers, states):
            sa.update(a, targets.to(a.device))
            sb.update(b, targets.to(b.device))
            paired.update(a, b.to(a.device))
        agree = (logits_s[:, :-1][keep.to(logits_s.device)].argmax(-1).cpu()
                 == logits_t[:, :-1][keep.to(logits_t.device)].argmax(-1).cpu()).double()
        same.index_add_(0, targets, agree)
        seen += torch.bincount(targets, minlength=classes.num_classes).double()
    if states is None:
        raise KdcollapseError("no token batches to analyse")
    present = seen > 0
    return states, {"agreement": float(same.sum() / seen.sum().clamp_min(1)),
                    "agreement_class_mean": float((same[present] / seen[present]).mean()),
                    "positions": int(seen.sum())}


def analyze_tokens_against(student: nn.Module, teacher: nn.Module, batches: Sequence[Batch], *,
                           layers: str | Sequence[int] | None = None, min_count: int = 2,
                           ignore_index: int = IGNORE_INDEX, accumulate: str = "auto",
                           out_dir: str | Path | None = None, progress: bool = False, source: str | None = None,
                           teacher_source: str | None = None, kept: list[int] | None = None) -> dict:
    """The student's next-token geometry against the teacher's over ``batches`` (re-iterable: a count pass
    over the token ids, then one pass of both models), for the student hidden states ``layers`` (as
    ``analyze_tokens``'s: ``"last"``, ``"all"`` or indices) each against the teacher's at its relative depth, or,
    for a student made of the teacher's decoder layers ``kept`` (a distill-lm run's ``student_layers``), against the
    teacher's hidden state after the same layer (:func:`~kdcollapse.analysis._stages.kept_pairs`). Returns ``{"classes", "layers": {"<i>/<j>": geometry_alignment's numbers}, "agreement", ...}``; with
    ``out_dir`` also writes ``against.json`` and ``against.md``."""
    start = time.perf_counter()
    rows_s, rows_t = _head_rows(student, "student"), _head_rows(teacher, "teacher")
    if rows_s.shape[0] != rows_t.shape[0]:
        raise KdcollapseError(f"the student's output embedding has {rows_s.shape[0]} rows, the teacher's "
                              f"{rows_t.shape[0]}: --against compares next-token classes of one vocabulary")
    classes = token_classes(batches, rows_s.shape[0], min_count=min_count, ignore_index=ignore_index)
    total_s, total_t = student.config.num_hidden_layers + 1, teacher.config.num_hidden_layers + 1
    chosen = resolve_layers(layers, total_s)
    if kept is not None and len(kept) != total_s - 1:
        raise KdcollapseError(f"kept names {len(kept)} teacher layers; the student has {total_s - 1}")
    pairs = [pair for pair in kept_pairs(kept, total_t) if pair[0] in chosen] if kept is not None \
        else relative_pairs(chosen, total_s, total_t)
    modes = student.training, teacher.training
    student.eval()
    teacher.eval()
    try:
        states, agreement = token_geometry_pass(student, teacher, batches, classes, pairs, ignore_index=ignore_index,
                                                accumulate=accumulate, progress=progress)
    finally:
        student.train(modes[0])
        teacher.train(modes[1])
    kept = classes.kept
    out = {}
    for (i, j), (sa, sb, paired) in zip(pairs, states):
        weights = (None, None)
        if i == total_s - 1 and j == total_t - 1:  # the features the two classifiers read
            weights = (rows_s[kept.to(rows_s.device)].to(sa.moment.device),
                       rows_t[kept.to(rows_t.device)].to(sa.moment.device))
        values = geometry_alignment(sa, sb, *weights, paired=paired)
        out[f"{i}/{j}"] = {k: float(v) for k, v in values.items()}
    result = {"classes": classes.summary(), "layers": out, "num_hidden_states": [total_s, total_t], **agreement,
              "source": source, "teacher": teacher_source, "seconds": time.perf_counter() - start}
    if out_dir is not None:
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text(out_dir / "against.json", json.dumps(result, indent=1, sort_keys=True) + "\n")
        write_text(out_dir / "against.md", markdown_tokens_against(result))
    return result


def markdown_tokens_against(result: dict) -> str:
    """``against.md`` of :func:`analyze_tokens_against`: one row per (student, teacher) hidden-state pair."""
    layers = result["layers"]
    keys = [k for k in MEANINGS if any(k in v for v in layers.values())]
    c = result["classes"]
    lines = [f"# Student against teacher, next-token classes: {result.get('source')} vs {result.get('teacher')}", "",
             f"{c['tokens']} next tokens, {c['classes_kept']} classes kept (min_count {c['min_count']}); "
             f"{result['positions']} positions compared; top-1 agreement {result['agreement']:.4f} "
             f"(mean over classes {result['agreement_class_mean']:.4f}). A row is a student hidden state / the "
             "teacher's at its relative depth (0 = the embeddings); the classifier columns only for the last "
             "two.", "",
             markdown_table(["student/teacher layer", *keys],
                            [(name, *("" if v.get(k) is None else f"{v[k]:.4g}" for k in keys))
                             for name, v in layers.items()]),
             "", "## Meanings", "", markdown_table(["key", "meaning"], [(k, MEANINGS[k]) for k in keys])]
    return "\n".join(lines) + "\n"


__all__ = ["analyze_tokens_against", "markdown_tokens_against", "token_geometry_pass"]
