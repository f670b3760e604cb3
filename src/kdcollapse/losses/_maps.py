"""What the feature-map losses share: checking (B, C, H, W) maps and bringing two to one size."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses._reduce import accumulation_dtype
from kdcollapse.losses._shapes import check_tensor


def stages(name: str, maps: Tensor | Sequence[Tensor]) -> list[Tensor]:
    """``maps`` as a list of (B, C, H, W) maps, one per stage (a lone tensor is one stage)."""
    maps = [maps] if isinstance(maps, Tensor) else list(maps)
    if not maps:
        raise KdcollapseError(f"{name} is empty: give at least one (B, C, H, W) feature map")
    for i, x in enumerate(maps):
        check_tensor(f"{name}[{i}]", x, (4,))
    return maps


def paired_stages(student: Tensor | Sequence[Tensor],
                  teacher: Tensor | Sequence[Tensor]) -> list[tuple[Tensor, Tensor]]:
    """Student and teacher maps stage by stage, upcast to their accumulation dtype (float32 at least);
    equal counts of stages and equal batch sizes are required."""
    s, t = stages("student", student), stages("teacher", teacher)
    if len(s) != len(t):
        raise KdcollapseError(f"student has {len(s)} feature maps, teacher {len(t)}: pair them stage by stage")
    for i, (a, b) in enumerate(zip(s, t)):
        if a.shape[0] != b.shape[0]:
            raise KdcollapseError(f"batch sizes differ at stage {i}: student {tuple(a.shape)}, "
                                  f"teacher {tuple(b.shape)}")
    dtype = accumulation_dtype(*s, *t)
    return [(a.to(dtype), b.to(dtype)) for a, b in zip(s, t)]


def pool_to(x: Tensor, size: tuple[int, int]) -> Tensor:
    """``x`` average-pooled (adaptively, as the official code does) to spatial ``size``; unchanged if
    it has that size already."""
    return x if tuple(x.shape[-2:]) == tuple(size) else F.adaptive_avg_pool2d(x, size)


def common_size(a: Tensor, b: Tensor) -> tuple[int, int]:
    """The spatial size both maps are compared at: the smaller height and the smaller width."""
    return min(a.shape[-2], b.shape[-2]), min(a.shape[-1], b.shape[-1])
