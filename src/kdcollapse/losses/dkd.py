"""Decoupled knowledge distillation (Zhao et al., CVPR 2022)."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._divergence import Divergence, Parameter
from kdcollapse.losses._reduce import IGNORE_INDEX, constants, logit_samples, scaled_logits
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


def _token_dkd(log_q: Tensor, log_p: Tensor, target: Tensor, beta: float) -> Tensor:
    """The token divergence ``dkd``: TCKD + β·NCKD per row (DKD with α = 1, no τ²) from log-probabilities and the target token of each row.
    The non-target softmax is the rows with the target column removed, computed as a log-sum-exp over the
    other columns (equal to :func:`target_split` without its (N, V − 1) index)."""
    y = target.unsqueeze(-1)

    def split(log_r: Tensor) -> tuple[Tensor, Tensor]:
        log_target = log_r.gather(-1, y).squeeze(-1)
        others = log_r.scatter(-1, y, float("-inf"))
        log_others = others.logsumexp(-1)
        log_total = torch.logaddexp(log_target, log_others)
        log_b = torch.stack([log_target - log_total, log_others - log_total], -1)
        # the target column holds 0 in both sides' log r̂, so it adds 0 · (0 − 0) to NCKD and no gradient
        return log_b, (others - log_others.unsqueeze(-1)).scatter(-1, y, 0.0)

    log_b_q, log_nt_q = split(log_q)
    log_b_p, log_nt_p = split(log_p)
    non_target = (log_nt_p.exp() * (log_nt_p - log_nt_q)).scatter(-1, y, 0.0).sum(-1)
    return _kl(log_b_p, log_b_q) + beta * non_target


def _kl(log_a: Tensor, log_b: Tensor) -> Tensor:
    return (log_a.exp() * (log_a - log_b)).sum(-1)


# Also the token divergence ``dkd`` of distill-lm and fused_head_loss: α = 1, no τ², β named (default 8)
@register_loss("dkd", kind="logits+target", paper="Zhao et al. 2022, Decoupled knowledge distillation (CVPR)",
               equation="τ²·(α·TCKD + β·NCKD) (Sec. 3, eq. 7)", temperature=True, sequences=True,
               ignore_index=True, chunked=True, example=lambda k, y: {"target": y},
               divergence=Divergence(_token_dkd, {"beta": Parameter(
                   8.0, high=math.inf, meaning="NCKD's weight (the paper's CIFAR-100 value 8; α is 1)")}, target=True),
               reference=_references.dkd)
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

    def frozen_rows(s: Tensor, t: Tensor, y: Tensor) -> Tensor:  # a chunk, upcast by per_row
        return _StudentDKD.apply(s, t, y, alpha, beta, temperature, s.dtype)

    student, teacher = samples.logits
    if teacher.requires_grad or not constants(alpha, beta, temperature):  # other gradients, or tensor weights
        values = samples.per_row(rows, samples.target, chunk_size=chunk_size)
    elif chunk_size is None:  # a frozen teacher: the lean exact gradient, upcast inside
        values = _StudentDKD.apply(student, teacher, samples.target, alpha, beta, temperature, samples.dtype)
    else:
        values = samples.per_row(frozen_rows, samples.target, chunk_size=chunk_size)
    return temperature**2 * samples.reduce(values, reduction)


def _log_split(x: Tensor, y: Tensor, dtype: torch.dtype, temperature: float) -> tuple[Tensor, Tensor]:
    """``(log p̂, log b)`` of softmax(x/τ) as :func:`target_split`, with log p̂ in one new (N, K) tensor
    whose target column is −inf (p̂ = 0 there)."""
    z = scaled_logits(x, dtype, temperature)
    z_target = z.gather(-1, y.unsqueeze(-1)).squeeze(-1)
    z.scatter_(-1, y.unsqueeze(-1), -torch.inf)
    lse_non_target = torch.logsumexp(z, dim=-1)
    lse = torch.logaddexp(lse_non_target, z_target)
    return z.sub_(lse_non_target.unsqueeze(-1)), torch.stack([z_target - lse, lse_non_target - lse], dim=-1)


class _StudentDKD(torch.autograd.Function):
    """α·TCKD + β·NCKD per row for a teacher without gradient, with the exact gradient in the student.

    With z = s/τ, p = softmax(z), b = [p_y, 1 − p_y] and p̂ the non-target softmax, the gradient in z is
    α·m·(e_y − p) + β·(p̂_S − p̂_T) off the target, m = b^T_2·b^S_1 − b^T_1·b^S_2 (the TCKD factor
    (b^T_2·p_y/(1 − p_y) − b^T_1) times 1 − p_y), i.e. p̂_S·(β − α·m) − β·p̂_T off the target and α·m on it.
    Only the inputs (which the caller holds) and the (N, 2) splits are kept; the backward pass recomputes
    both non-target softmaxes in place, so forward + backward peak at about three (N, K) tensors where
    autograd keeps every intermediate of :func:`target_split` (results/benchmarks/bench_loss_memory.md).
    """

    @staticmethod
    def forward(ctx, student: Tensor, teacher: Tensor, target: Tensor, alpha: float, beta: float,
                temperature: float, dtype: torch.dtype) -> Tensor:
        log_nt_s, log_b_s = _log_split(student, target, dtype, temperature)
        log_nt_t, log_b_t = _log_split(teacher, target, dtype, temperature)
        tckd = (log_b_t.exp() * (log_b_t - log_b_s)).sum(-1)
        p_nt_t = log_nt_t.exp()
        for log_nt in (log_nt_s, log_nt_t):  # the target column: 0 · (−inf − −inf) would be NaN
            log_nt.scatter_(-1, target.unsqueeze(-1), 0.0)
        nckd = torch.einsum("nk,nk->n", p_nt_t, log_nt_t.sub_(log_nt_s))  # no (N, K) product
        ctx.save_for_backward(student, teacher, target, log_b_s, log_b_t)
        ctx.alpha, ctx.beta, ctx.temperature, ctx.dtype = alpha, beta, temperature, dtype
        return alpha * tckd + beta * nckd

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        student, teacher, target, log_b_s, log_b_t = ctx.saved_tensors
        if not ctx.needs_input_grad[0]:
            return (None,) * 7
        alpha, beta = ctx.alpha, ctx.beta
        b_s, b_t = log_b_s.exp(), log_b_t.exp()
        m = b_t[:, 1] * b_s[:, 0] - b_t[:, 0] * b_s[:, 1]
        p_nt_s = _log_split(student, target, ctx.dtype, ctx.temperature)[0].exp_()
        p_nt_t = _log_split(teacher, target, ctx.dtype, ctx.temperature)[0].exp_()
        dz = p_nt_s.mul_((beta - alpha * m).unsqueeze(-1)).sub_(p_nt_t, alpha=beta)
        del p_nt_t
        dz.scatter_(-1, target.unsqueeze(-1), (alpha * m).unsqueeze(-1))
        dz.mul_((grad / ctx.temperature).unsqueeze(-1))
        return dz.to(student.dtype), None, None, None, None, None, None
