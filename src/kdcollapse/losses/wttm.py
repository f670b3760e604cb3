"""Weighted transformed teacher matching, WTTM (Zheng & Yang, ICLR 2024)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._reduce import logit_samples
from kdcollapse.losses._shapes import check_positive


@register_loss("wttm", kind="logits",
               paper="Zheng & Yang 2024, Knowledge distillation based on transformed teacher matching (ICLR)",
               equation="U_γ(p_t)·KL(p_t^γ / U_γ(p_t) ‖ p_s), U_γ(p) = Σ_j p_j^γ (WTTM objective)",
               temperature=False, sequences=True, ignore_index=False, chunked=True,
               example=lambda k, y: {"gamma": 0.2},
               reference=_references.wttm)
def wttm_loss(student: Tensor, teacher: Tensor, gamma: float = 0.2, *, mask: Tensor | None = None,
              reduction: str = "mean", vocab_size: int | None = None, chunk_size: int | None = None,
              validate: bool | None = None) -> Tensor:
    """mean_b U_γ(p_t)·KL(p̃_t ‖ p_s), p̃_t = p_t^γ / U_γ(p_t), U_γ(p_t) = Σ_j p_{t,j}^γ.

    Transformed teacher matching: the teacher's probabilities p_t = softmax(z_t) raised to the power
    γ (γ = 1/τ: p̃_t = softmax(γ·z_t), a tempered teacher) are matched by the *untempered* student
    p_s = softmax(z_s); each sample is weighted by the power sum U_γ(p_t), larger for flatter teacher
    outputs (official ``distiller_zoo/wttm.py``; TTM is the same without the weight). The default
    γ = 0.2 is the official README's WTTM example. Shapes: (B, K) or (B, T, K), ``mask`` (B, T).
    LLM options: ``docs/losses.md``.
    """
    check_positive("gamma", gamma)
    samples = logit_samples({"student": student, "teacher": teacher}, mask=mask,
                            vocab_size=vocab_size, validate=validate, reduction=reduction)

    def rows(s: Tensor, t: Tensor) -> Tensor:
        powered = gamma * F.log_softmax(t, dim=-1)  # log p_t^γ
        log_q = F.log_softmax(powered, dim=-1)  # log p̃_t
        kl = (log_q.exp() * (log_q - F.log_softmax(s, dim=-1))).sum(-1)
        return torch.logsumexp(powered, dim=-1).exp() * kl

    return samples.reduce(samples.per_row(rows, chunk_size=chunk_size), reduction)
