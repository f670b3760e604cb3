"""A comprehensive overhaul of feature distillation (Heo et al., ICCV 2019): OFD's margin ReLU and
partial L2 distance on pre-ReLU features."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import _references
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses._maps import paired_stages, pool_to
from kdcollapse.losses._reduce import validating
from kdcollapse.losses._shapes import check_tensor, check_values

_MIN_TAIL = 1e-3  # the official rule: below this probability of x < 0, the margin is −3σ


def ofd_margin(std: Tensor, mean: Tensor) -> Tensor:
    """Per-channel margin m = E[x | x < 0] for x ~ N(mean, std²) (OFD eq. 2), float64.

    ``std`` and ``mean`` are (C,): the affine weight γ and bias β of the BatchNorm right before the
    teacher's ReLU, whose output is taken as Gaussian per channel. m = β − |γ|·φ(β/|γ|)/Φ(−β/|γ|);
    where Φ(−β/|γ|) ≤ 0.001 (almost no negative responses) the official code uses −3|γ| instead, and
    so does this. With γ = 0 the channel is the constant β: m = β if β < 0, else 0 (= −3|γ|).
    """
    check_tensor("std", std, (1,))
    check_tensor("mean", mean, (1,))
    if std.shape != mean.shape:
        raise KdcollapseError(f"std {tuple(std.shape)} and mean {tuple(mean.shape)} must both be (C,)")
    s, m = std.detach().double().abs(), mean.detach().double()
    a = m / s
    tail = torch.special.ndtr(-a)  # P(x < 0)
    log_pdf = -a.pow(2) / 2 - 0.5 * math.log(2 * math.pi)
    margin = m - s * torch.exp(log_pdf - torch.special.log_ndtr(-a))
    margin = torch.where(tail > _MIN_TAIL, margin, -3 * s)
    return torch.where(s == 0, m.clamp(max=0), margin)


def ofd_distance(student: Tensor, teacher: Tensor, margin: Tensor) -> Tensor:
    """Σ_{c,h,w} d_p(σ_m(T), S), mean over the batch: OFD's partial L2 (eq. 5) after the margin ReLU.

    σ_m(T) = max(T, m) per channel (eq. 3); d_p(t, s) = 0 where s ≤ t ≤ 0, (t − s)² elsewhere: the
    student is not pushed below a negative teacher target, only above a positive one.
    ``student`` (B, C, H, W) is the connected student map, ``teacher`` the teacher's pre-ReLU map of
    the same shape, ``margin`` (C,).
    """
    target = torch.maximum(teacher, margin.to(teacher).view(1, -1, 1, 1))
    diff = (student - target).pow(2)
    return torch.where((student <= target) & (target <= 0), 0, diff).sum((1, 2, 3)).mean()


def _ofd_example() -> tuple[Tensor, Tensor, Tensor]:
    student, teacher, margin = example_tensors((4, 3, 2, 2), (4, 3, 4, 4), (3,))
    return student, teacher, -margin.abs()


@register_loss("ofd", kind="features", paper="Heo et al. 2019, A comprehensive overhaul of feature distillation (ICCV)",
               equation="Σ_i 2^−(n−1−i)·d_p(σ_m(T_i), S_i), margin ReLU and partial L2 (eqs. 2-5)", temperature=False,
               sequences=False, ignore_index=False, chunked=False, inputs=_ofd_example,
               reference=_references.ofd)
def ofd_loss(student_maps: Tensor | Sequence[Tensor], teacher_maps: Tensor | Sequence[Tensor],
             margins: Tensor | Sequence[Tensor], *, validate: bool | None = None) -> Tensor:
    """Σ_i 2^−(n−1−i)·:func:`ofd_distance`(S_i, pool(T_i), m_i) over n stages, as mdistiller's ``OFD``.

    ``student_maps``: the student's pre-ReLU stage maps after the method's connectors (conv + BN),
    each with its teacher map's channels; ``teacher_maps``: the teacher's pre-ReLU maps, average-pooled
    to the student's spatial size when larger; ``margins``: one (C,) tensor per stage from
    :func:`ofd_margin` (≤ 0; checked when validating). The last stage weighs 1, each earlier one half the next. mdistiller weights
    the sum by 1e-3 on CIFAR-100 and 1e-4 on ImageNet (the method applies it). The teacher side carries
    no gradient. Half inputs accumulate in float32.
    """
    pairs = paired_stages(student_maps, teacher_maps)
    margins = [margins] if isinstance(margins, Tensor) else list(margins)
    if len(margins) != len(pairs):
        raise KdcollapseError(f"give one margin per stage: {len(pairs)} stages, {len(margins)} margins")
    total, n = 0, len(pairs)
    for i, ((s, t), m) in enumerate(zip(pairs, margins)):
        t = pool_to(t.detach(), tuple(s.shape[-2:]))
        if s.shape[1] != t.shape[1] or tuple(m.shape) != (s.shape[1],):
            raise KdcollapseError(f"stage {i}: student map {tuple(s.shape)}, teacher map {tuple(t.shape)} and "
                                  f"margin {tuple(m.shape)} must share the teacher's channel count")
        if validating(validate):
            check_values({"student_maps": s, "teacher_maps": t, "margins": m})
            if not bool((m <= 0).all()):
                raise KdcollapseError(f"margins[{i}] has positive entries; a margin is E[x | x < 0] <= 0 "
                                      f"(use ofd_margin)")
        total = total + ofd_distance(s, t, m) / 2 ** (n - 1 - i)
    return total
