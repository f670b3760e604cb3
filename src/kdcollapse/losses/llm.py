"""Causal language models: align each position's logits with the next token's label, and the token
divergences of LLM distillation (forward and reverse KL, GKD's generalized JSD, DistiLLM's skew KLs,
total variation).

Every divergence is a function of the student's and the teacher's log-probabilities per row
(:data:`DIVERGENCES`), so the unfused losses here, the losses fused with the output head and the losses
on stored top-k teacher tokens share one definition. With p the teacher's and q the student's
distribution at temperature τ (softmax(z / τ)), per token:

* ``forward_kl``: KL(p ‖ q); ``reverse_kl``: KL(q ‖ p);
* ``jsd`` (GKD, Agarwal et al. 2024, eq. 1, as TRL's ``generalized_jsd_loss``): with m = β p + (1 − β) q,
  β KL(p ‖ m) + (1 − β) KL(q ‖ m); β = 0 is KL(p ‖ q) and β = 1 is KL(q ‖ p), as in TRL;
* ``skew_forward_kl`` (DistiLLM, Ko et al. 2024, eq. 3): KL(p ‖ α p + (1 − α) q);
  ``skew_reverse_kl``: KL(q ‖ α q + (1 − α) p); α = 0 gives the plain KLs;
* ``tvd``: ½ Σ |p − q|;
* ``dkd`` (Zhao et al. 2022, decoupled KD, with α = 1; needs the target token y of every row,
  :data:`TARGET_DIVERGENCES`): KL(b_p ‖ b_q) + β KL(p̂ ‖ q̂), b = [r_y, 1 − r_y] the target / non-target
  split and r̂ the distribution among the non-targets; it is :func:`kdcollapse.losses.dkd_loss` with
  ``alpha=1`` divided by its τ².

No τ² factor (TRL's, DistiLLM's and torchtune's convention; :func:`kd_loss` keeps Hinton's τ²). Mixtures
are formed in log space (``logaddexp``), so no probability is clamped or logged at zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError, unknown_choice
from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses._reduce import IGNORE_INDEX, check_mask, check_target, logit_samples
from kdcollapse.losses._shapes import check_positive, check_tensor


class CausalLMBatch(NamedTuple):
    """Shifted logits (B, T − 1, V), next-token labels (B, T − 1) and the positions to use."""

    student: Tensor
    teacher: Tensor | None
    labels: Tensor
    mask: Tensor


def shift_for_causal_lm(student_logits: Tensor, teacher_logits: Tensor | None, labels: Tensor,
                        mask: Tensor | None = None, *,
                        ignore_index: int = IGNORE_INDEX) -> CausalLMBatch:
    """Pair the logits at position t with the label at t + 1, as Hugging Face causal LMs do.

    ``student_logits``/``teacher_logits`` (B, T, V) (the teacher may be None), ``labels`` (B, T)
    with ``ignore_index`` where there is nothing to predict, ``mask`` (B, T) bool or 0/1 (an
    attention mask; None = every position). The returned ``mask`` (B, T − 1, bool) keeps a position
    when its next token is attended and labelled, so label-free losses (``kd_loss``) skip the same
    positions as label-taking ones. The logits are views; nothing is copied.
    """
    check_tensor("student_logits", student_logits, (3,))
    lead = tuple(student_logits.shape[:-1])
    if lead[1] < 2:
        raise KdcollapseError(f"shift_for_causal_lm needs T >= 2 positions, got shape "
                              f"{tuple(student_logits.shape)}")
    if teacher_logits is not None:
        check_tensor("teacher_logits", teacher_logits, (3,))
        if tuple(teacher_logits.shape[:-1]) != lead:
            raise KdcollapseError(f"teacher_logits must have the student's (B, T) = {lead}, got "
                                  f"shape {tuple(teacher_logits.shape)}")
    keep = check_target(labels, lead)[:, 1:] != ignore_index
    if mask is not None:
        keep = keep & check_mask(mask, lead)[:, 1:].bool()
    teacher = None if teacher_logits is None else teacher_logits[:, :-1]
    return CausalLMBatch(student_logits[:, :-1], teacher, labels[:, 1:], keep)


def _kl(log_a: Tensor, log_b: Tensor) -> Tensor:
    """KL(a ‖ b) per row from log-probabilities."""
    return (log_a.exp() * (log_a - log_b)).sum(-1)


def _log_mixture(log_a: Tensor, log_b: Tensor, weight: float) -> Tensor:
    """log(w·a + (1 − w)·b), elementwise, without leaving log space."""
    if weight == 1:
        return log_a
    if weight == 0:
        return log_b
    return torch.logaddexp(log_a + math.log(weight), log_b + math.log1p(-weight))


def _jsd(log_q: Tensor, log_p: Tensor, beta: float) -> Tensor:
    if beta == 0:
        return _kl(log_p, log_q)
    if beta == 1:
        return _kl(log_q, log_p)
    log_m = _log_mixture(log_p, log_q, beta)
    return beta * _kl(log_p, log_m) + (1 - beta) * _kl(log_q, log_m)


def _dkd(log_q: Tensor, log_p: Tensor, target: Tensor, beta: float) -> Tensor:
    """TCKD + β·NCKD per row (DKD with α = 1, no τ²) from log-probabilities and the target token of each row.
    The non-target softmax is the rows with the target column removed, computed as a log-sum-exp over the
    other columns (equal to :func:`kdcollapse.losses.dkd.target_split` without its (N, V − 1) index)."""
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


# name -> (per-row divergence f(student log-probs, teacher log-probs, parameter), its parameter or None)
DIVERGENCES: dict[str, tuple[Callable[..., Tensor], str | None]] = {
    "forward_kl": (lambda log_q, log_p: _kl(log_p, log_q), None),
    "reverse_kl": (lambda log_q, log_p: _kl(log_q, log_p), None),
    "jsd": (_jsd, "beta"),
    "skew_forward_kl": (lambda log_q, log_p, alpha: _kl(log_p, _log_mixture(log_p, log_q, alpha)), "alpha"),
    "skew_reverse_kl": (lambda log_q, log_p, alpha: _kl(log_q, _log_mixture(log_q, log_p, alpha)), "alpha"),
    "tvd": (lambda log_q, log_p: 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1), None),
}


# divergences that also take each row's target token: f(student log-probs, teacher log-probs, target, parameter)
TARGET_DIVERGENCES: dict[str, tuple[Callable[..., Tensor], str]] = {"dkd": (_dkd, "beta")}


# divergences declared in their own modules (losses/akl.py, abkd.py, distillm2.py) with their own parameters:
# name -> bind(parameters or None for the defaults) -> f(student log-probs, teacher log-probs), parameters checked
BOUND_DIVERGENCES: dict[str, Callable[[object], Callable[..., Tensor]]] = {}


def divergence_rows(divergence: str, weight: float | None = None, *, targets: bool = False) -> Callable[..., Tensor]:
    """The per-row function ``f(student_log_probs, teacher_log_probs) -> (N,)`` of ``divergence``, with its
    β (``jsd``) or α (skew KLs) bound to ``weight`` (in [0, 1]); for a :data:`TARGET_DIVERGENCES` entry
    ``f(student_log_probs, teacher_log_probs, target)``, with DKD's β ≥ 0 bound to ``weight`` (default 8,
    :func:`kdcollapse.losses.dkd_loss`'s), accepted only where the caller has ``targets``; for a
    :data:`BOUND_DIVERGENCES` entry its parameters (None: its defaults)."""
    if divergence in BOUND_DIVERGENCES:
        return BOUND_DIVERGENCES[divergence](weight)
    if divergence in TARGET_DIVERGENCES and not targets:
        raise KdcollapseError(f"divergence {divergence!r} needs the target token of every row: use "
                              f"kdcollapse.losses.{divergence}_loss, or fused_head_loss with labels")
    if divergence in TARGET_DIVERGENCES:
        fn, parameter = TARGET_DIVERGENCES[divergence]
        weight = 8.0 if weight is None else weight
        if not (isinstance(weight, (int, float)) and not isinstance(weight, bool) and 0 <= weight < math.inf):
            raise KdcollapseError(f"{parameter} of {divergence} must be a number >= 0, got {weight!r}")
        return lambda log_q, log_p, target: fn(log_q, log_p, target, float(weight))
    if divergence not in DIVERGENCES:
        raise KdcollapseError(unknown_choice("divergence", divergence, {**DIVERGENCES, **BOUND_DIVERGENCES,
                                                                        **(TARGET_DIVERGENCES if targets else {})}))
    fn, parameter = DIVERGENCES[divergence]
    if parameter is None:
        return fn
    if not (isinstance(weight, (int, float)) and 0 <= weight <= 1):
        raise KdcollapseError(f"{parameter} of {divergence} must be a number in [0, 1], got {weight!r}")
    return lambda log_q, log_p: fn(log_q, log_p, float(weight))


def token_divergence(student: Tensor, teacher: Tensor, divergence: str = "forward_kl",
                     weight: float | None = None, temperature: float = 1.0, *, mask: Tensor | None = None,
                     reduction: str = "mean", vocab_size: int | None = None, chunk_size: int | None = None,
                     validate: bool | None = None) -> Tensor:
    """Mean over kept tokens of ``divergence`` between softmax(teacher / τ) and softmax(student / τ).

    ``student``, ``teacher``: logits (B, K) or (B, T, K); ``divergence`` one of :data:`DIVERGENCES`
    with ``weight`` its β or α; ``mask``, ``reduction``, ``vocab_size``, ``chunk_size``, ``validate``
    as in every logit loss (``docs/losses.md``). Gradients flow into both arguments as in the formula.
    """
    rows = divergence_rows(divergence, weight)
    check_positive("temperature", temperature)
    samples = logit_samples({"student": student, "teacher": teacher}, mask=mask, vocab_size=vocab_size,
                            validate=validate, reduction=reduction)
    values = samples.per_row(lambda s, t: rows(F.log_softmax(s / temperature, -1),
                                               F.log_softmax(t / temperature, -1)), chunk_size=chunk_size)
    return samples.reduce(values, reduction)


_OPTIONS = dict(temperature=True, sequences=True, ignore_index=False, chunked=True)


@register_loss("forward_kl", kind="logits", paper="Hinton et al. 2015; Agarwal et al. 2024 (GKD) Sec. 3",
               equation="KL(softmax(z_t/τ) ‖ softmax(z_s/τ)) per token, no τ²", **_OPTIONS,
               example=lambda k, y: {"temperature": 2.0})
def forward_kl_loss(student: Tensor, teacher: Tensor, temperature: float = 1.0, *, mask: Tensor | None = None,
                    reduction: str = "mean", vocab_size: int | None = None, chunk_size: int | None = None,
                    validate: bool | None = None) -> Tensor:
    """Mean over tokens of KL(p_teacher ‖ q_student) at temperature τ (no τ² factor)."""
    return token_divergence(student, teacher, "forward_kl", None, temperature, mask=mask, reduction=reduction,
                            vocab_size=vocab_size, chunk_size=chunk_size, validate=validate)


@register_loss("reverse_kl", kind="logits", paper="Agarwal et al. 2024 (GKD); Gu et al. 2024 (MiniLLM)",
               equation="KL(softmax(z_s/τ) ‖ softmax(z_t/τ)) per token, no τ²", **_OPTIONS,
               example=lambda k, y: {"temperature": 2.0})
def reverse_kl_loss(student: Tensor, teacher: Tensor, temperature: float = 1.0, *, mask: Tensor | None = None,
                    reduction: str = "mean", vocab_size: int | None = None, chunk_size: int | None = None,
                    validate: bool | None = None) -> Tensor:
    """Mean over tokens of KL(q_student ‖ p_teacher) at temperature τ (no τ² factor)."""
    return token_divergence(student, teacher, "reverse_kl", None, temperature, mask=mask, reduction=reduction,
                            vocab_size=vocab_size, chunk_size=chunk_size, validate=validate)


@register_loss("jsd", kind="logits", paper="Agarwal et al. 2024, On-policy distillation of language models (GKD)",
               equation="β KL(p ‖ m) + (1−β) KL(q ‖ m), m = βp + (1−β)q (eq. 1)", **_OPTIONS,
               example=lambda k, y: {"beta": 0.3}, variants={"endpoint": lambda k, y: {"beta": 1.0}})
def jsd_loss(student: Tensor, teacher: Tensor, beta: float = 0.5, temperature: float = 1.0, *,
             mask: Tensor | None = None, reduction: str = "mean", vocab_size: int | None = None,
             chunk_size: int | None = None, validate: bool | None = None) -> Tensor:
    """GKD's generalized Jensen-Shannon divergence (Agarwal et al. 2024, eq. 1; TRL's default β = 0.5):
    β KL(p ‖ m) + (1 − β) KL(q ‖ m), m = β p + (1 − β) q; β = 0 forward KL, β = 1 reverse KL."""
    return token_divergence(student, teacher, "jsd", beta, temperature, mask=mask, reduction=reduction,
                            vocab_size=vocab_size, chunk_size=chunk_size, validate=validate)


@register_loss("skew_forward_kl", kind="logits", paper="Ko et al. 2024, DistiLLM",
               equation="KL(p ‖ αp + (1−α)q) (eq. 3)", **_OPTIONS, example=lambda k, y: {"alpha": 0.1})
def skew_forward_kl_loss(student: Tensor, teacher: Tensor, alpha: float = 0.1, temperature: float = 1.0, *,
                         mask: Tensor | None = None, reduction: str = "mean", vocab_size: int | None = None,
                         chunk_size: int | None = None, validate: bool | None = None) -> Tensor:
    """DistiLLM's skew KL (Ko et al. 2024, eq. 3; official α = 0.1): KL(p ‖ α p + (1 − α) q)."""
    return token_divergence(student, teacher, "skew_forward_kl", alpha, temperature, mask=mask,
                            reduction=reduction, vocab_size=vocab_size, chunk_size=chunk_size, validate=validate)


@register_loss("skew_reverse_kl", kind="logits", paper="Ko et al. 2024, DistiLLM",
               equation="KL(q ‖ αq + (1−α)p) (eq. 4)", **_OPTIONS,
               example=lambda k, y: {"alpha": 0.2, "temperature": 0.5})
def skew_reverse_kl_loss(student: Tensor, teacher: Tensor, alpha: float = 0.1, temperature: float = 1.0, *,
                         mask: Tensor | None = None, reduction: str = "mean", vocab_size: int | None = None,
                         chunk_size: int | None = None, validate: bool | None = None) -> Tensor:
    """DistiLLM's skew reverse KL (Ko et al. 2024; official α = 0.1): KL(q ‖ α q + (1 − α) p)."""
    return token_divergence(student, teacher, "skew_reverse_kl", alpha, temperature, mask=mask,
                            reduction=reduction, vocab_size=vocab_size, chunk_size=chunk_size, validate=validate)


@register_loss("tvd", kind="logits", paper="Ko et al. 2024, DistiLLM (tv_distance); Wen et al. 2023 (f-divergences)",
               equation="½ Σ_v |p_v − q_v| per token", **_OPTIONS, example=lambda k, y: {})
def tvd_loss(student: Tensor, teacher: Tensor, temperature: float = 1.0, *, mask: Tensor | None = None,
             reduction: str = "mean", vocab_size: int | None = None, chunk_size: int | None = None,
             validate: bool | None = None) -> Tensor:
    """Mean over tokens of the total variation distance ½ Σ_v |p_v − q_v| (DistiLLM's ``tv_distance``)."""
    return token_divergence(student, teacher, "tvd", None, temperature, mask=mask, reduction=reduction,
                            vocab_size=vocab_size, chunk_size=chunk_size, validate=validate)
