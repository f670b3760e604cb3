"""Vanilla knowledge distillation (Hinton et al., 2015)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses._shapes import check_positive, flatten_logits


def kd_loss(student: Tensor, teacher: Tensor, temperature: float = 4.0, *,
            mask: Tensor | None = None) -> Tensor:
    """τ² · mean_b KL(softmax(z_t/τ) ‖ softmax(z_s/τ)) (Hinton et al. 2015).

    ``student``, ``teacher``: logits (B, K) or (B, T, K); ``mask`` (B, T) bool selects positions.
    Returns a scalar. Gradients flow into both arguments as in the KL itself; a frozen teacher
    simply has none.
    """
    check_positive("temperature", temperature)
    (s, t), _ = flatten_logits({"student": student, "teacher": teacher}, mask=mask)
    log_p_t = F.log_softmax(t / temperature, dim=-1)
    log_p_s = F.log_softmax(s / temperature, dim=-1)
    kl = (log_p_t.exp() * (log_p_t - log_p_s)).sum(-1)
    return temperature**2 * kl.mean()
