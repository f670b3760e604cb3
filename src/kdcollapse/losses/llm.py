"""Causal language models: align each position's logits with the next token's label, and the token
divergences of LLM distillation (forward and reverse KL, GKD's generalized JSD, DistiLLM's skew KLs,
total variation).

Every divergence is ONE declaration, ``register_loss(..., divergence=Divergence(parameters=...))`` on its
per-row formula of the student's and the teacher's log-probabilities (:mod:`kdcollapse.losses._divergence`),
so the unfused losses here (generated from it, e.g. ``jsd_loss``), the losses fused with the output head,
the losses on stored top-k teacher tokens and ``distill-lm``'s config share one definition, and its
parameters have names (``beta``, ``alpha``). With p the teacher's and q the student's
distribution at temperature τ (softmax(z / τ)), per token:

* ``forward_kl``: KL(p ‖ q); ``reverse_kl``: KL(q ‖ p);
* ``jsd`` (GKD, Agarwal et al. 2024, eq. 1, as TRL's ``generalized_jsd_loss``): with m = β p + (1 − β) q,
  β KL(p ‖ m) + (1 − β) KL(q ‖ m); β = 0 is KL(p ‖ q) and β = 1 is KL(q ‖ p), as in TRL;
* ``skew_forward_kl`` (DistiLLM, Ko et al. 2024, eq. 3): KL(p ‖ α p + (1 − α) q);
  ``skew_reverse_kl``: KL(q ‖ α q + (1 − α) p); α = 0 gives the plain KLs;
* ``tvd``: ½ Σ |p − q|;
* ``dkd`` (Zhao et al. 2022, decoupled KD, with α = 1; needs the target token y of every row; declared
  with :func:`kdcollapse.losses.dkd_loss` in :mod:`kdcollapse.losses.dkd`): KL(b_p ‖ b_q) + β KL(p̂ ‖ q̂), b = [r_y, 1 − r_y] the target / non-target
  split and r̂ the distribution among the non-targets; it is :func:`kdcollapse.losses.dkd_loss` with
  ``alpha=1`` divided by its τ².

No τ² factor (TRL's, DistiLLM's and torchtune's convention; :func:`kd_loss` keeps Hinton's τ²). Mixtures
are formed in log space (``logaddexp``), so no probability is clamped or logged at zero.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import NamedTuple

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError, unknown_choice
from kdcollapse.losses import _token_references as _ref
from kdcollapse.losses._catalog import LossInfo, get_loss, list_losses, register_loss
from kdcollapse.losses._divergence import Divergence, Parameter, tempered_rows
from kdcollapse.losses._reduce import IGNORE_INDEX, check_mask, check_target
from kdcollapse.losses._shapes import check_tensor


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


def _forward_kl_gradient(log_q: Tensor, log_p: Tensor) -> tuple[Tensor, Tensor]:
    p = log_p.exp()
    return (p * (log_p - log_q)).sum(-1), p.neg_()


def _reverse_kl_gradient(log_q: Tensor, log_p: Tensor) -> tuple[Tensor, Tensor]:
    q = log_q.exp()
    g = (log_q - log_p).mul_(q)  # q (log q − log p); its row sum is KL(q ‖ p)
    return g.sum(-1), g.add_(q)


def _jsd_gradient(log_q: Tensor, log_p: Tensor, beta: float) -> tuple[Tensor, Tensor]:
    """JSD's ∂/∂log q = (1 − β) q (log q − log m): the m-terms cancel (∂/∂q of β KL(p ‖ m) is −β(1 − β) p / m)."""
    if beta == 0:
        return _forward_kl_gradient(log_q, log_p)
    if beta == 1:
        return _reverse_kl_gradient(log_q, log_p)
    log_m = _log_mixture(log_p, log_q, beta)
    q = log_q.exp()
    g = (log_q - log_m).mul_(q)
    values = beta * (log_p.exp() * (log_p - log_m)).sum(-1) + (1 - beta) * g.sum(-1)
    return values, g.mul_(1 - beta)


# --- the declarations: one register_loss each (its per-row formula, named parameters, paper) ---------------

_OPTIONS = dict(kind="logits", temperature=True, sequences=True, ignore_index=False, chunked=True)
_UNIT = "in [0, 1]"


@register_loss("forward_kl", paper="Hinton et al. 2015; Agarwal et al. 2024 (GKD) Sec. 3",
               equation="KL(softmax(z_t/τ) ‖ softmax(z_s/τ)) per token, no τ²", **_OPTIONS,
               example=lambda k, y: {"temperature": 2.0}, divergence=Divergence(gradient=_forward_kl_gradient, f_divergence=True),
               reference=_ref.forward_kl)
def _forward_kl(log_q: Tensor, log_p: Tensor) -> Tensor:
    return _kl(log_p, log_q)


@register_loss("reverse_kl", paper="Agarwal et al. 2024 (GKD); Gu et al. 2024 (MiniLLM)",
               equation="KL(softmax(z_s/τ) ‖ softmax(z_t/τ)) per token, no τ²", **_OPTIONS,
               example=lambda k, y: {"temperature": 2.0}, divergence=Divergence(gradient=_reverse_kl_gradient, f_divergence=True),
               reference=_ref.reverse_kl)
def _reverse_kl(log_q: Tensor, log_p: Tensor) -> Tensor:
    return _kl(log_q, log_p)


@register_loss("jsd", paper="Agarwal et al. 2024, On-policy distillation of language models (GKD)",
               equation="β KL(p ‖ m) + (1−β) KL(q ‖ m), m = βp + (1−β)q (eq. 1)", **_OPTIONS,
               example=lambda k, y: {"beta": 0.3}, variants={"endpoint": lambda k, y: {"beta": 1.0}},
               divergence=Divergence(parameters={"beta": Parameter(
                   0.5, meaning="the teacher's weight in the mixture m (TRL's default 0.5; 0: forward KL, 1: reverse KL)")},
                   gradient=_jsd_gradient, f_divergence=True), reference=_ref.jsd)
def _jsd_rows(log_q: Tensor, log_p: Tensor, beta: float) -> Tensor:
    return _jsd(log_q, log_p, beta)


@register_loss("skew_forward_kl", paper="Ko et al. 2024, DistiLLM", equation="KL(p ‖ αp + (1−α)q) (eq. 3)",
               **_OPTIONS, example=lambda k, y: {"alpha": 0.1}, divergence=Divergence(parameters={"alpha": Parameter(
                   0.1, meaning="the teacher's weight in the skewed student (official 0.1; 0: forward KL)")}), reference=_ref.skew_forward_kl)
def _skew_forward_kl(log_q: Tensor, log_p: Tensor, alpha: float) -> Tensor:
    return _kl(log_p, _log_mixture(log_p, log_q, alpha))


@register_loss("skew_reverse_kl", paper="Ko et al. 2024, DistiLLM", equation="KL(q ‖ αq + (1−α)p) (eq. 4)",
               **_OPTIONS, example=lambda k, y: {"alpha": 0.2, "temperature": 0.5},
               divergence=Divergence(parameters={"alpha": Parameter(
                   0.1, meaning="the student's weight in the skewed teacher (official 0.1; 0: reverse KL)")}), reference=_ref.skew_reverse_kl)
def _skew_reverse_kl(log_q: Tensor, log_p: Tensor, alpha: float) -> Tensor:
    return _kl(log_q, _log_mixture(log_q, log_p, alpha))


@register_loss("tvd", paper="Ko et al. 2024, DistiLLM (tv_distance); Wen et al. 2023 (f-divergences)",
               equation="½ Σ_v |p_v − q_v| per token", **_OPTIONS, example=lambda k, y: {}, divergence=Divergence(),
               reference=_ref.tvd)
def _tvd(log_q: Tensor, log_p: Tensor) -> Tensor:
    return 0.5 * (log_p.exp() - log_q.exp()).abs().sum(-1)


forward_kl_loss = get_loss("forward_kl").function
reverse_kl_loss = get_loss("reverse_kl").function
jsd_loss = get_loss("jsd").function
skew_forward_kl_loss = get_loss("skew_forward_kl").function
skew_reverse_kl_loss = get_loss("skew_reverse_kl").function
tvd_loss = get_loss("tvd").function


# --- what the language-model paths read: the declarations of every token divergence ------------------------

def token_divergences(*, targets: bool = True) -> dict[str, LossInfo]:
    """Every declared token divergence by name (``targets=False``: only those that need no target token),
    read from the loss catalogue (also divergences declared in other modules, e.g. ``dkd``)."""
    import kdcollapse.losses  # noqa: F401  (every module's declarations)

    return {info.name: info for info in list_losses() if info.divergence is not None
            and (targets or not info.divergence.target)}


def divergence_info(divergence: str, *, targets: bool = True) -> LossInfo:
    """The declaration of token divergence ``divergence``; an unknown name lists the declared ones, and one
    that needs the target token of every row is refused unless the caller has ``targets``."""
    found = token_divergences()
    if divergence not in found:
        raise KdcollapseError(unknown_choice("divergence", divergence, token_divergences(targets=targets)))
    info = found[divergence]
    if info.divergence.target and not targets:
        raise KdcollapseError(f"divergence {divergence!r} needs the target token of every row: use "
                              f"kdcollapse.losses.{divergence}_loss, or fused_head_loss with labels")
    return info


def divergence_gradient(divergence: str, parameters: Mapping[str, float | None] | None = None
                        ) -> Callable[..., tuple[Tensor, Tensor]] | None:
    """The declared ``gradient(log_q, log_p) -> (values, ∂values/∂log_q)`` of ``divergence`` with its parameters
    bound, or None when the declaration has none (:class:`~kdcollapse.losses._divergence.Divergence`)."""
    return divergence_info(divergence).divergence.bind_gradient(divergence, dict(parameters or {}))


def divergence_rows(divergence: str, parameters: Mapping[str, float | None] | None = None, *,
                    targets: bool = False) -> Callable[..., Tensor]:
    """The per-row function ``f(student_log_probs, teacher_log_probs) -> (N,)`` of ``divergence`` with its
    named ``parameters`` bound (a missing or ``None`` one: its declared default); for a divergence that needs
    each row's target token, ``f(student_log_probs, teacher_log_probs, target)``, accepted only where the
    caller has ``targets``."""
    info = divergence_info(divergence, targets=targets)
    return info.divergence.bind(divergence, dict(parameters or {}))


def token_divergence(student: Tensor, teacher: Tensor, divergence: str = "forward_kl", temperature: float = 1.0, *,
                     mask: Tensor | None = None, reduction: str = "mean", vocab_size: int | None = None,
                     chunk_size: int | None = None, validate: bool | None = None, **parameters: float) -> Tensor:
    """Mean over kept tokens of the declared ``divergence`` between softmax(teacher / τ) and
    softmax(student / τ), its parameters by name (``token_divergence(s, t, "jsd", beta=0.3)``).

    ``student``, ``teacher``: logits (B, K) or (B, T, K); ``mask``, ``reduction``, ``vocab_size``,
    ``chunk_size``, ``validate`` as in every logit loss (``docs/losses.md``). Gradients flow into both
    arguments as in the formula.
    """
    return tempered_rows(divergence_rows(divergence, parameters), student, teacher, temperature, mask=mask,
                         reduction=reduction, vocab_size=vocab_size, chunk_size=chunk_size, validate=validate)
