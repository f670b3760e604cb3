"""BinaryKL and BinaryKL-Norm, the logit-level losses of Dual-Head KD (Yang et al., DHKD eq. 1, 5).

Both are written with log-sigmoid / softplus, so no probability is clamped and values and gradients
stay finite for any finite logits (the official code clamps σ to [1e-8, 1 − 1e-8]; where that clamp
is inactive the two agree).
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses._reduce import logit_samples
from kdcollapse.losses._shapes import check_positive


def binary_kl_loss(student: Tensor, teacher: Tensor, temperature: float = 2.0, *,
                   mask: Tensor | None = None, reduction: str = "mean",
                   vocab_size: int | None = None, chunk_size: int | None = None,
                   validate: bool | None = None) -> Tensor:
    """τ² · mean_b Σ_k KL([σ(t_k), σ(−t_k)] ‖ [σ(s_k), σ(−s_k)]), t = z_t/τ, s = z_s/τ (DHKD eq. 1).

    Each class is a binary problem; the KL is summed over classes and averaged over samples.
    Shapes: (B, K) or (B, T, K) logits, optional (B, T) bool or 0/1 ``mask``.
    ∂/∂s_k = σ(s_k) − σ(t_k).
    LLM options and precision: ``docs/losses.md``.
    """
    check_positive("temperature", temperature)
    samples = logit_samples({"student": student, "teacher": teacher}, mask=mask,
                            vocab_size=vocab_size, validate=validate, reduction=reduction)

    def rows(s: Tensor, t: Tensor) -> Tensor:
        s, t = s / temperature, t / temperature
        log_q_t, log_q_s = F.logsigmoid(t), F.logsigmoid(s)
        log_r_t, log_r_s = F.logsigmoid(-t), F.logsigmoid(-s)  # log(1 − σ(x)) = log σ(−x)
        kl = log_q_t.exp() * (log_q_t - log_q_s) + log_r_t.exp() * (log_r_t - log_r_s)
        return kl.sum(-1)

    kl = samples.per_row(rows, chunk_size=chunk_size)
    return temperature**2 * samples.reduce(kl, reduction)


def binary_kl_norm_loss(student: Tensor, teacher: Tensor, temperature: float = 2.0, *,
                        mask: Tensor | None = None, reduction: str = "mean",
                        vocab_size: int | None = None, chunk_size: int | None = None,
                        validate: bool | None = None) -> Tensor:
    """τ² · mean_b Σ_k KL([½, ½] ‖ [σ(u_k), σ(−u_k)]), u = (z_s − z_t)/τ (DHKD eq. 5).

    KL([½, ½] ‖ [σ(u), σ(−u)]) = ½·softplus(u) + ½·softplus(−u) − log 2, which is 0 exactly at
    z_s = z_t and has ∂/∂u = σ(u) − ½. Shapes as in :func:`binary_kl_loss`.
    """
    check_positive("temperature", temperature)
    samples = logit_samples({"student": student, "teacher": teacher}, mask=mask,
                            vocab_size=vocab_size, validate=validate, reduction=reduction)

    def rows(s: Tensor, t: Tensor) -> Tensor:
        u = (s - t) / temperature
        return (0.5 * (F.softplus(u) + F.softplus(-u)) - math.log(2.0)).sum(-1)

    kl = samples.per_row(rows, chunk_size=chunk_size)
    return temperature**2 * samples.reduce(kl, reduction)
