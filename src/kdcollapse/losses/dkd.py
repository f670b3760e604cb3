"""Decoupled knowledge distillation (Zhao et al., CVPR 2022)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses._reduce import IGNORE_INDEX, logit_samples
from kdcollapse.losses._shapes import check_positive


def target_split(z: Tensor, target: Tensor) -> tuple[Tensor, Tensor]:
    """log b = [log p_t, log(1 − p_t)] of softmax(z) and the log-softmax among non-targets.

    Computed from log-sum-exps, so neither probability is ever rounded to 0 or 1 before its log.
    """
    others = torch.arange(z.shape[-1] - 1, device=z.device)
    others = others + (others >= target.unsqueeze(-1))  # (N, K-1): every class but the target
    non_target = z.gather(-1, others)
    lse = torch.logsumexp(z, dim=-1)
    log_b = torch.stack([z.gather(-1, target.unsqueeze(-1)).squeeze(-1) - lse,
                         torch.logsumexp(non_target, dim=-1) - lse], dim=-1)
    return log_b, F.log_softmax(non_target, dim=-1)


@register_loss("dkd", kind="logits+target", paper="Zhao et al. 2022, Decoupled knowledge distillation (CVPR)",
               equation="τ²·(α·TCKD + β·NCKD) (Sec. 3, eq. 7)", temperature=True, sequences=True,
               ignore_index=True, chunked=True, example=lambda k, y: {"target": y})
def dkd_loss(student: Tensor, teacher: Tensor, target: Tensor, alpha: float = 1.0, beta: float = 8.0,
             temperature: float = 4.0, *, mask: Tensor | None = None,
             ignore_index: int = IGNORE_INDEX, reduction: str = "mean",
             vocab_size: int | None = None, chunk_size: int | None = None,
             validate: bool | None = None) -> Tensor:
    """τ² · mean_b [α·TCKD + β·NCKD] (Zhao et al. 2022, Sec. 3; official reduction: sum / B).

    TCKD = KL(b_T ‖ b_S) with b = [p_t, 1 − p_t] the binary target / non-target split of
    softmax(z/τ); NCKD = KL(p̂_T ‖ p̂_S) with p̂ the softmax among the K − 1 non-target classes.
    KD = TCKD + (1 − p_t^T)·NCKD (the paper's reformulation of KD), so α = β = 1 is *not* KD
    in general.

    ``student``, ``teacher``: (B, K) or (B, T, K); ``target``: (B,) or (B, T) labels, positions
    labelled ``ignore_index`` dropped; ``mask`` (B, T) bool or 0/1. The non-target softmax is exact
    (the official code approximates it by subtracting 1000 from the target logit). Needs K ≥ 3.
    LLM options and precision: ``docs/losses.md``.
    """
    check_positive("temperature", temperature)
    samples = logit_samples({"student": student, "teacher": teacher}, target=target, mask=mask,
                            ignore_index=ignore_index, vocab_size=vocab_size, validate=validate,
                            reduction=reduction)
    if samples.logits[0].shape[-1] < 3:
        raise KdcollapseError(f"dkd_loss needs K >= 3 classes (NCKD compares distributions over the "
                              f"K - 1 non-target classes), got K = {samples.logits[0].shape[-1]}")

    def rows(s: Tensor, t: Tensor, y: Tensor) -> Tensor:
        log_b_s, log_nt_s = target_split(s / temperature, y)
        log_b_t, log_nt_t = target_split(t / temperature, y)
        tckd = (log_b_t.exp() * (log_b_t - log_b_s)).sum(-1)
        nckd = (log_nt_t.exp() * (log_nt_t - log_nt_s)).sum(-1)
        return alpha * tckd + beta * nckd

    values = samples.per_row(rows, samples.target, chunk_size=chunk_size)
    return temperature**2 * samples.reduce(values, reduction)
