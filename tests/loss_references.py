"""Slow, obviously-correct references for the losses, written straight from the papers' definitions.

Loops over samples (and classes where it keeps the formula visible); float64 callers get exact
comparisons. The declared references live beside the losses (kdcollapse/losses/_references.py); this file
re-exports those and keeps the official forms the declarations do not name. ``ikl_pairwise`` is the
official O(B·K²) form and also the baseline of ``benchmarks/bench_ikl.py``.
"""

from __future__ import annotations

import torch

# The references the losses' declarations name (register_loss(..., reference=...)), shared, not copied.
from kdcollapse.losses._references import dkd, kd, rkd, trades, tuplet  # noqa: F401


def _clamped_sigmoid(x):
    return torch.sigmoid(x).clamp(1e-8, 1 - 1e-8)


def binary_kl_clamped(student, teacher, temperature):
    """The official BinaryKL (DHKD eq. 1): probabilities clamped to [1e-8, 1 − 1e-8], sum / B."""
    q_t, q_s = _clamped_sigmoid(teacher / temperature), _clamped_sigmoid(student / temperature)
    kl_ = q_t * torch.log(q_t / q_s) + (1 - q_t) * torch.log((1 - q_t) / (1 - q_s))
    return temperature**2 * kl_.sum() / student.shape[0]


def binary_kl_norm_clamped(student, teacher, temperature):
    """The official BinaryKL-Norm (DHKD eq. 5): KL([½, ½] ‖ [σ(u), 1 − σ(u)]), σ clamped, sum / B."""
    q = _clamped_sigmoid((student - teacher) / temperature)
    kl_ = 0.5 * torch.log(0.5 / q) + 0.5 * torch.log(0.5 / (1 - q))
    return temperature**2 * kl_.sum() / student.shape[0]


def ikl_pairwise(student, teacher, weights, mse_weight=1.0, ce_weight=1.0, temperature=1.0):
    """DKL paper eq. 10 as the official code computes it: a B×K×K tensor of pair differences.

    ``weights`` (B, K) are used as given (the caller detaches them); the soft labels are detached.
    """
    delta_t = teacher.unsqueeze(2) - teacher.unsqueeze(1)
    delta_s = student.unsqueeze(2) - student.unsqueeze(1)
    pair_weights = weights.unsqueeze(2) * weights.unsqueeze(1)
    wmse = 0.25 * ((delta_t - delta_s).pow(2) * pair_weights).sum((1, 2))
    soft = torch.softmax(teacher / temperature, -1).detach()
    ce = -(soft * torch.log_softmax(student / temperature, -1)).sum(-1)
    return (mse_weight * wmse + ce_weight * ce).mean()


def cross_entropy(logits, target):
    return torch.stack([-torch.log_softmax(z, 0)[y] for z, y in zip(logits, target.tolist())]).mean()
