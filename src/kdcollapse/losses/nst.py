"""Neuron selectivity transfer (Huang & Wang, 2017): MMD between the channels' spatial patterns."""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses import _references
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses._maps import common_size, paired_stages, pool_to
from kdcollapse.losses._reduce import validating
from kdcollapse.losses._shapes import check_values


def _kernel_mean(a: Tensor, b: Tensor) -> Tensor:
    """mean over samples and channel pairs of k(a_i, b_j) = (a_i·b_j)², the polynomial kernel of
    degree 2 (NST eq. 6 with c = 0), as ‖A Bᵀ‖²_F per sample: O(B·C²) memory."""
    return (a @ b.transpose(1, 2)).pow(2).mean()


@register_loss("nst", kind="features", paper="Huang & Wang 2017, Like what you like: knowledge distill via neuron "
               "selectivity transfer", equation="Σ_stages MMD² of the channels' normalised maps, k(x, y) = (xᵀy)² "
               "(eqs. 4-6)", temperature=False, sequences=False, ignore_index=False, chunked=False,
               inputs=lambda: example_tensors((4, 3, 4, 4), (4, 5, 2, 2)),
               reference=_references.nst)
def nst_loss(student_maps: Tensor | Sequence[Tensor], teacher_maps: Tensor | Sequence[Tensor], *,
             validate: bool | None = None) -> Tensor:
    """Σ_stages MMD²(student channels, teacher channels) with k(x, y) = (xᵀy)² (NST eq. 4-6).

    Each channel's H·W responses, L2-normalised, is one sample of its network's distribution; per
    image, MMD² = mean k(f_T, f_T') + mean k(f_S, f_S') − 2·mean k(f_S, f_T) over the channel pairs,
    averaged over the batch, as mdistiller's ``nst_loss``. Channels may differ; the larger map is
    average-pooled to the smaller one. mdistiller weights the sum by 50 on CIFAR-100 (the method
    applies it). The teacher side carries no gradient. Half inputs accumulate in float32.
    """
    total = 0
    for s, t in paired_stages(student_maps, teacher_maps):
        if validating(validate):
            check_values({"student_maps": s, "teacher_maps": t})
        size = common_size(s, t)
        f_s = F.normalize(pool_to(s, size).flatten(2), dim=2)
        f_t = F.normalize(pool_to(t.detach(), size).flatten(2), dim=2)
        total = total + _kernel_mean(f_t, f_t) + _kernel_mean(f_s, f_s) - 2 * _kernel_mean(f_s, f_t)
    return total
