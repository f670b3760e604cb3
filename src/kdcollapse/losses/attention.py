"""Attention transfer (Zagoruyko & Komodakis, ICLR 2017), activation-based, as mdistiller runs it."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses import _references
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses._maps import common_size, paired_stages, pool_to, stages
from kdcollapse.losses._reduce import validating
from kdcollapse.losses._shapes import check_positive, check_values


def attention_map(feature_map: Tensor, p: float = 2.0) -> Tensor:
    """Q/‖Q‖₂ with Q = vec(F^p_mean(A)) = vec((1/C)·Σ_c |A_c|^p), (B, H·W) (AT paper eq. 1-2).

    The spatial attention of a (B, C, H, W) activation: the channel mean of |A|^p at every
    position, flattened and L2-normalised per sample (``F.normalize``, eps 1e-12, as the official
    code). The official code raises A itself to the power p; for the post-ReLU maps it reads, or an
    even p, that is |A|^p.
    """
    (a,) = stages("feature_map", feature_map)
    check_positive("p", p)
    return F.normalize(a.abs().pow(p).mean(1).flatten(1), dim=1)


@register_loss("at", kind="features", paper="Zagoruyko & Komodakis 2017, Paying more attention to attention (ICLR)",
               equation="Σ_j mean (Q_s/‖Q_s‖ − Q_t/‖Q_t‖)², Q = mean_c |A_c|^p (eqs. 1-2)", temperature=False,
               sequences=False, ignore_index=False, chunked=False,
               inputs=lambda: example_tensors((4, 3, 4, 4), (4, 5, 2, 2)),
               reference=_references.at)
def at_loss(student_maps: Tensor | Sequence[Tensor], teacher_maps: Tensor | Sequence[Tensor], p: float = 2.0,
            *, validate: bool | None = None) -> Tensor:
    """Σ_stages mean_{b,j} (Q_s[b, j] − Q_t[b, j])², Q = :func:`attention_map` (AT paper eq. 2).

    One (B, C, H, W) map (or a sequence of them, one per stage) on each side; channels may differ.
    Where the spatial sizes differ the larger map is average-pooled to the smaller one first, as
    mdistiller's ``single_stage_at_loss`` does. The paper's β/2·‖·‖_p is replaced, as in the
    authors' code, by the mean of the squared differences over batch and positions, and β = 1000
    weights it (mdistiller's CIFAR-100 and ImageNet configs); the method applies that weight. The
    teacher side carries no gradient. Half inputs accumulate in float32.
    """
    check_positive("p", p)
    total = 0
    for s, t in paired_stages(student_maps, teacher_maps):
        if validating(validate):
            check_values({"student_maps": s, "teacher_maps": t})
        size = common_size(s, t)
        q_s, q_t = attention_map(pool_to(s, size), p), attention_map(pool_to(t.detach(), size), p)
        total = total + (q_s - q_t).pow(2).mean()
    return total
