"""Stage maps of image models for collapse analysis: each stage's ``(B, C, H, W)`` output pooled to a ``(B, C)``
feature (global average pooling, the penultimate layer's own pooling in every zoo model), from the same forward
pass as the penultimate feature (``forward_intermediates``)."""

from __future__ import annotations

from torch import Tensor, nn

from kdcollapse.errors import KdcollapseError

PENULTIMATE = "features"  # the key of the penultimate feature beside the stages


def parse_stages(text: str | None) -> list[int] | None:
    """``--stages``: None (off), ``all`` (every stage: []) or comma-separated stage indices."""
    if text is None:
        return None
    if text.strip() == "all":
        return []
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise KdcollapseError(f"--stages must be 'all' or comma-separated stage indices, got {text!r}") from None


def resolve_stages(model: nn.Module, stages: list[int] | None) -> list[int]:
    """The stage indices of ``model`` (every one for ``[]``), checked against its ``feature_info``."""
    from kdcollapse.models import stage_indices

    info = getattr(model, "feature_info", None) or []
    if stages is None:
        return []
    if not info:
        raise KdcollapseError(f"{type(model).__name__} has no stage outputs (feature_info is empty): --stages "
                              "needs a model with forward_intermediates")
    return stage_indices(info, None if stages == [] else stages)


def pooled(maps: list[Tensor]) -> list[Tensor]:
    """Each stage map as a (B, C) float32 feature: the spatial mean of a (B, C, H, W) map, a (B, C) map as it is."""
    out = []
    for m in maps:
        out.append((m.mean(dim=tuple(range(2, m.ndim))) if m.ndim > 2 else m).float())
    return out


def stage_forward(model: nn.Module, x: Tensor, stages: list[int]) -> tuple[Tensor, list[Tensor]]:
    """``(h, pooled stage features)`` of one forward pass; ``stages`` empty: ``(forward_features(x), [])``."""
    if not stages:
        return model.forward_features(x), []
    h, maps = model.forward_intermediates(x, stages)
    return h, pooled(maps)


def stage_names(model: nn.Module, stages: list[int]) -> list[str]:
    """``stage<i>`` for each stage (its index in ``feature_info``)."""
    return [f"stage{i}" for i in stages]


def relative_pairs(student: list[int], student_total: int, teacher_total: int) -> list[tuple[int, int]]:
    """(student stage, teacher stage) for each of the ``student`` stages: the teacher stage at the nearest
    relative depth, i / (n - 1) against j / (m - 1) for models of n and m stages (the same count: stage for
    stage)."""
    if student_total == 1:
        return [(i, teacher_total - 1) for i in student]
    return [(i, round(i * (teacher_total - 1) / (student_total - 1))) for i in student]


def kept_pairs(kept: list[int], teacher_total: int) -> list[tuple[int, int]]:
    """(student stage, teacher stage) for a student made of the teacher's decoder layers ``kept`` (0-based, in
    order: ``student.init.layers``): the embeddings against the embeddings, and the student's hidden state after
    its i-th layer against the teacher's after that same layer (``kept[i - 1] + 1``)."""
    if any(not 0 <= layer < teacher_total - 1 for layer in kept) or sorted(set(kept)) != list(kept):
        raise KdcollapseError(f"kept layers {kept} are not increasing decoder layers of a teacher of "
                              f"{teacher_total - 1} layers")
    return [(0, 0), *((i + 1, layer + 1) for i, layer in enumerate(kept))]


__all__ = ["PENULTIMATE", "kept_pairs", "parse_stages", "pooled", "relative_pairs", "resolve_stages", "stage_forward",
           "stage_names"]
