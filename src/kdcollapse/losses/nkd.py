"""Normalized knowledge distillation, NKD (Yang et al., ICCV 2023)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._reduce import IGNORE_INDEX, logit_samples
from kdcollapse.losses._shapes import check_positive
from kdcollapse.losses.dkd import target_split


@register_loss("nkd", kind="logits+target",
               paper="Yang et al. 2023, From knowledge distillation to self-knowledge distillation (ICCV)",
               equation="−T_t·log S_t − γ·τ²·Σ_{j≠t} T̂_j(τ) log Ŝ_j(τ) (eq. 8)", temperature=True,
               sequences=True, ignore_index=True, chunked=True, example=lambda k, y: {"target": y},
               reference=_references.nkd)
def nkd_loss(student: Tensor, teacher: Tensor, target: Tensor, temperature: float = 1.0,
             gamma: float = 1.5, *, mask: Tensor | None = None, ignore_index: int = IGNORE_INDEX,
             reduction: str = "mean", vocab_size: int | None = None, chunk_size: int | None = None,
             validate: bool | None = None) -> Tensor:
    """mean_b [−S(T_t)·log S_t − γ·τ²·Σ_{j≠t} T̂_j log Ŝ_j] (NKD paper eq. 8; official cls_KD code).

    The target term compares the teacher's target probability T_t (temperature 1, no gradient)
    with the student's log-probability of the target; the non-target term is the cross-entropy of
    the *normalized* non-target distributions T̂ = softmax of the teacher's K − 1 non-target logits
    over τ, Ŝ the student's. Cross-entropies, not KLs, as in the official code, so the value
    includes the teacher's entropy (a constant for the student). Defaults: ImageNet config of the
    official code (τ = 1, γ = 1.5). Shapes: (B, K) or (B, T, K), ``target`` (B,) or (B, T)
    (``ignore_index`` labels dropped), ``mask`` (B, T). LLM options: ``docs/losses.md``.
    """
    check_positive("temperature", temperature)
    samples = logit_samples({"student": student, "teacher": teacher}, target=target, mask=mask,
                            ignore_index=ignore_index, vocab_size=vocab_size, validate=validate,
                            reduction=reduction)

    def rows(s: Tensor, t: Tensor, y: Tensor) -> Tensor:
        log_s_t = F.log_softmax(s, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1)
        t_t = F.softmax(t, dim=-1).gather(-1, y.unsqueeze(-1)).squeeze(-1).detach()
        _, log_s_hat = target_split(s / temperature, y)
        _, log_t_hat = target_split(t / temperature, y)
        non_target = (log_t_hat.exp() * log_s_hat).sum(-1)
        return -t_t * log_s_t - gamma * temperature**2 * non_target

    return samples.reduce(samples.per_row(rows, samples.target, chunk_size=chunk_size), reduction)
