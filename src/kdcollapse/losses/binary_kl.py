"""BinaryKL and BinaryKL-Norm, the logit-level losses of Dual-Head KD (Yang et al., DHKD eq. 1, 5).

Both are written with log-sigmoid / softplus, so no probability is clamped and values and gradients
stay finite for any finite logits (the official code clamps σ to [1e-8, 1 − 1e-8]; where that clamp
is inactive the two agree). ``form="official"`` computes the official clamped expression instead, in
the logits' dtype: in float32 the upper bound 1 − 1e-8 rounds to 1.0, so once σ(x/τ) rounds to 1
(x/τ > 24·ln 2 ≈ 16.6, i.e. a logit above ≈ 33 at τ = 2) log(1 − σ) = −inf and the loss is inf or NaN.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError, unknown_choice
from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._reduce import logit_samples
from kdcollapse.losses._shapes import check_positive

FORMS = ("stable", "official")
OFFICIAL_EPS = 1e-8  # the official code clamps σ to [eps, 1 − eps]


def _official_binary_kl(s: Tensor, q_t: Tensor) -> Tensor:
    """Per row, Σ_k KL([q_t, 1−q_t] ‖ [q_s, 1−q_s]), q_s = clamp(σ(s), eps, 1 − eps), term by term as the
    official code evaluates it (``KLDivLoss(reduction="none")``: xlogy(q, q) − q·log p)."""
    q_s = torch.sigmoid(s).clamp(min=OFFICIAL_EPS, max=1 - OFFICIAL_EPS)
    r_t = 1 - q_t
    kl = (torch.xlogy(q_t, q_t) - q_t * torch.log(q_s)) + (torch.xlogy(r_t, r_t) - r_t * torch.log(1 - q_s))
    return kl.sum(-1)


def _check_form(form: str) -> None:
    if form not in FORMS:
        raise KdcollapseError(unknown_choice("BinaryKL form", form, FORMS))


@register_loss("binary_kl", kind="logits", paper="DHKD (Yang et al. 2024), binary KL",
               equation="τ²·Σ_k KL([σ(t_k), σ(−t_k)] ‖ [σ(s_k), σ(−s_k)]) (eq. 1)", temperature=True,
               sequences=True, ignore_index=False, chunked=True, example=lambda k, y: {},
               reference=_references.binary_kl)
def binary_kl_loss(student: Tensor, teacher: Tensor, temperature: float = 2.0, *,
                   mask: Tensor | None = None, form: str = "stable", reduction: str = "mean",
                   vocab_size: int | None = None, chunk_size: int | None = None,
                   validate: bool | None = None) -> Tensor:
    """τ² · mean_b Σ_k KL([σ(t_k), σ(−t_k)] ‖ [σ(s_k), σ(−s_k)]), t = z_t/τ, s = z_s/τ (DHKD eq. 1).

    Each class is a binary problem; the KL is summed over classes and averaged over samples.
    Shapes: (B, K) or (B, T, K) logits, optional (B, T) bool or 0/1 ``mask``.
    ∂/∂s_k = σ(s_k) − σ(t_k).
    ``form``: ``"stable"`` (log-sigmoid, finite everywhere) or ``"official"`` (both σ clamped as in the
    official code; inf/NaN in float32 once z/τ > ≈ 16.6, see the module docstring).
    LLM options and precision: ``docs/losses.md``.
    """
    check_positive("temperature", temperature)
    _check_form(form)
    samples = logit_samples({"student": student, "teacher": teacher}, mask=mask,
                            vocab_size=vocab_size, validate=validate, reduction=reduction)

    def rows(s: Tensor, t: Tensor) -> Tensor:
        s, t = s / temperature, t / temperature
        if form == "official":
            return _official_binary_kl(s, torch.sigmoid(t).clamp(min=OFFICIAL_EPS, max=1 - OFFICIAL_EPS))
        log_q_t, log_q_s = F.logsigmoid(t), F.logsigmoid(s)
        log_r_t, log_r_s = F.logsigmoid(-t), F.logsigmoid(-s)  # log(1 − σ(x)) = log σ(−x)
        kl = log_q_t.exp() * (log_q_t - log_q_s) + log_r_t.exp() * (log_r_t - log_r_s)
        return kl.sum(-1)

    kl = samples.per_row(rows, chunk_size=chunk_size)
    return temperature**2 * samples.reduce(kl, reduction)


@register_loss("binary_kl_norm", kind="logits", paper="DHKD (Yang et al. 2024), binary KL-Norm",
               equation="τ²·Σ_k KL([½, ½] ‖ [σ(u_k), σ(−u_k)]), u = (z_s − z_t)/τ (eq. 5)",
               temperature=True, sequences=True, ignore_index=False, chunked=True,
               example=lambda k, y: {},
               reference=_references.binary_kl_norm)
def binary_kl_norm_loss(student: Tensor, teacher: Tensor, temperature: float = 2.0, *,
                        mask: Tensor | None = None, form: str = "stable", reduction: str = "mean",
                        vocab_size: int | None = None, chunk_size: int | None = None,
                        validate: bool | None = None) -> Tensor:
    """τ² · mean_b Σ_k KL([½, ½] ‖ [σ(u_k), σ(−u_k)]), u = (z_s − z_t)/τ (DHKD eq. 5).

    KL([½, ½] ‖ [σ(u), σ(−u)]) = ½·softplus(u) + ½·softplus(−u) − log 2, which is 0 exactly at
    z_s = z_t and has ∂/∂u = σ(u) − ½. Shapes and ``form`` as in :func:`binary_kl_loss` (the official
    code clamps σ(u) the same way: inf in float32 once u > ≈ 16.6).
    """
    check_positive("temperature", temperature)
    _check_form(form)
    samples = logit_samples({"student": student, "teacher": teacher}, mask=mask,
                            vocab_size=vocab_size, validate=validate, reduction=reduction)

    def rows(s: Tensor, t: Tensor) -> Tensor:
        u = (s - t) / temperature
        if form == "official":
            return _official_binary_kl(u, torch.full_like(u, 0.5))
        return (0.5 * (F.softplus(u) + F.softplus(-u)) - math.log(2.0)).sum(-1)

    kl = samples.per_row(rows, chunk_size=chunk_size)
    return temperature**2 * samples.reduce(kl, reduction)
