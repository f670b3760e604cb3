"""Decoupled and Improved KL divergence (DKL / IKL; Cui et al., DKL paper eq. 5 and 10).

Both losses are a weighted MSE over all logit differences plus a soft-label cross-entropy. The weight
of pair (j, k) is the outer product w_j·w_k, so the K×K sum collapses to O(K) per sample:
Σ_jk w_j w_k (a_j − a_k)² = 2·(Σw)·Σ_j w_j (a_j − ā)², ā = Σ_j w_j a_j / Σw. This centred form
avoids the cancellation of the equal 2[(Σw)(Σ w a²) − (Σ w a)²] when a has a large common offset.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import _references
from kdcollapse.losses._catalog import class_table, register_loss
from kdcollapse.losses._reduce import IGNORE_INDEX, Samples, logit_samples, validating
from kdcollapse.losses._shapes import check_positive, check_values, describe


class _WeightedPairwiseSq(torch.autograd.Function):
    """Σ_jk w_j w_k (a_j − a_k)² = 2·W·Σ_j w_j (a_j − ā)² per row, W = Σw, ā = Σ w a / W.

    Its gradient w.r.t. a is 4·W·w·(a − ā) (the ā term drops out since Σ w (a − ā) = 0), written out
    so that only w·(a − ā) is kept for the backward pass: 2-3× faster and leaner than autograd
    through the same expression. The weights are constants (stop-gradient in DKL / IKL).
    """

    @staticmethod
    def forward(ctx, a: Tensor, w: Tensor) -> Tensor:
        total = w.sum(-1)
        inverse = 1 / total.clamp_min(torch.finfo(total.dtype).tiny)
        centred = a - (torch.einsum("nk,nk->n", w, a) * inverse).unsqueeze(-1)
        # Second pass (corrected two-pass mean): removes the rounding error of the first centre,
        # which is large next to the spread when a has a big common offset.
        centred -= (torch.einsum("nk,nk->n", w, centred) * inverse).unsqueeze(-1)
        weighted = w * centred
        ctx.save_for_backward(weighted, total)
        return 2 * total * torch.einsum("nk,nk->n", weighted, centred)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        weighted, total = ctx.saved_tensors
        return weighted * (4 * total * grad).unsqueeze(-1), None


def weighted_pairwise_sq(a: Tensor, w: Tensor) -> Tensor:
    """Σ_jk w_j w_k (a_j − a_k)² for each row of (N, K) ``a`` and constant weights ``w``, in O(N·K)."""
    return _WeightedPairwiseSq.apply(a, w.detach().to(a.dtype))


def _decoupled(diff: Tensor, weights: Tensor, soft_labels: Tensor, log_probs: Tensor,
               mse_weight: float, ce_weight: float) -> Tensor:
    """Per row: mse_weight·¼·Σ_jk w_j w_k (diff_j − diff_k)² − ce_weight·Σ_j soft_j log p_j."""
    wmse = 0.25 * weighted_pairwise_sq(diff, weights)
    ce = -(soft_labels * log_probs).sum(-1)
    return mse_weight * wmse + ce_weight * ce


@register_loss("dkl", reference_first=True,
               kind="logits", paper="Cui et al. 2024, Decoupled Kullback-Leibler divergence loss",
               equation="wMSE + β·soft cross-entropy (eq. 5)", temperature=False, sequences=True,
               ignore_index=False, chunked=True, example=lambda k, y: {},
               reference=_references.dkl)
def dkl_loss(logits_m: Tensor, logits_n: Tensor, alpha: float = 1.0, beta: float = 1.0, *,
             mask: Tensor | None = None, reduction: str = "mean", vocab_size: int | None = None,
             chunk_size: int | None = None, validate: bool | None = None) -> Tensor:
    """Decoupled KL (DKL paper eq. 5), mean over samples.

    (α/4)·Σ_jk (Δm_jk − S(Δn_jk))²·S(s_m^j s_m^k) − β·Σ_j S(s_m^j) log s_n^j, with Δm_jk = m_j − m_k,
    s = softmax, S = stop-gradient. ``logits_m`` is the reference side (o_m: the teacher in KD, the
    natural image in adversarial training), ``logits_n`` the side being fitted (o_n: student,
    adversarial image). With α = β = 1 the gradients w.r.t. both inputs equal those of
    KL(softmax(m) ‖ softmax(n)) (Lemma 1); the loss *value* differs from the KL.
    Shapes: (B, K) or (B, T, K), optional (B, T) bool or 0/1 ``mask``. LLM options and precision:
    ``docs/losses.md``.
    """
    samples = logit_samples({"logits_m": logits_m, "logits_n": logits_n}, mask=mask,
                            vocab_size=vocab_size, validate=validate, reduction=reduction)

    def rows(m: Tensor, n: Tensor) -> Tensor:
        s_m = F.softmax(m, dim=-1).detach()
        return _decoupled(m - n.detach(), s_m, s_m, F.log_softmax(n, dim=-1), alpha, beta)

    return samples.reduce(samples.per_row(rows, chunk_size=chunk_size), reduction)


@register_loss("ikl", kind="logits", paper="Cui et al. 2024, Decoupled Kullback-Leibler divergence loss",
               equation="IKL: class-wise weighted wMSE + soft cross-entropy (eq. 10)", temperature=True,
               sequences=True, ignore_index=True, chunked=True,
               example=lambda k, y: {"temperature": 2.0, "mse_weight": 8.0},
               variants={"class_weights": lambda k, y: {"class_weights": class_table(k), "target": y}},
               k_squared=("class_weights",),
               reference=_references.ikl)
def ikl_loss(student: Tensor, teacher: Tensor, *, class_weights: Tensor | None = None,
             target: Tensor | None = None, mse_weight: float = 1.0, ce_weight: float = 1.0,
             temperature: float = 1.0, mask: Tensor | None = None,
             ignore_index: int = IGNORE_INDEX, reduction: str = "mean",
             vocab_size: int | None = None, chunk_size: int | None = None,
             validate: bool | None = None) -> Tensor:
    """Improved KL (DKL paper eq. 10), mean over samples.

    mse_weight·¼·Σ_jk ((t_j − t_k) − (s_j − s_k))²·w_j w_k − ce_weight·Σ_j S(softmax(t/τ))_j
    log softmax(s/τ)_j. The teacher is o_m, the student o_n. The wMSE uses raw logits and stops no
    gradient on either side ("breaking asymmetry"): with a frozen teacher only the student learns,
    in adversarial training the natural logits get the gradient too. The cross-entropy has no τ²
    factor (official code).

    Weights w (never differentiated): ``class_weights[target]`` when ``class_weights`` (a K×K table,
    row y = the class-wise mean probability vector s̄_y, "global information") is given, otherwise
    the sample-wise S(softmax(teacher)). Paper α/β = ``mse_weight``/``ce_weight``; the official code
    swaps the letters. Shapes: (B, K) or (B, T, K), ``target`` (B,) or (B, T) (``ignore_index``
    labels dropped), ``mask`` (B, T) bool or 0/1. LLM options and precision: ``docs/losses.md``.
    """
    check_positive("temperature", temperature)
    samples = logit_samples({"student": student, "teacher": teacher}, target=target, mask=mask,
                            ignore_index=ignore_index, vocab_size=vocab_size, validate=validate,
                            reduction=reduction)
    rows = ikl_on_samples(samples, class_weights, mse_weight, ce_weight, temperature, validate)
    labels = () if class_weights is None else (samples.target,)
    return samples.reduce(samples.per_row(rows, *labels, chunk_size=chunk_size), reduction)


def ikl_on_samples(samples: Samples, class_weights: Tensor | None, mse_weight: float,
                   ce_weight: float, temperature: float,
                   validate: bool | None) -> Callable[..., Tensor]:
    """The per-row IKL ``rows(student, teacher[, target])`` of :func:`ikl_loss` on ``samples``,
    after checking ``class_weights`` against them (shared with ``ikl_at_loss``)."""
    if class_weights is not None:
        k = samples.logits[0].shape[-1]
        if samples.target is None:
            raise KdcollapseError("class_weights needs target: the weight rows are picked by label")
        if not isinstance(class_weights, Tensor) or tuple(class_weights.shape) != (k, k):
            raise KdcollapseError(f"class_weights must be a ({k}, {k}) tensor (row y = mean "
                                  f"probabilities of class y), got {describe(class_weights)}")
        if validating(validate):
            check_values({"class_weights": class_weights})
        class_weights = class_weights.detach()

    def rows(student: Tensor, teacher: Tensor, *target: Tensor) -> Tensor:
        if class_weights is None:
            weights = F.softmax(teacher, dim=-1).detach()
        else:
            weights = class_weights[target[0]]
        soft_labels = F.softmax(teacher / temperature, dim=-1).detach()
        log_probs = F.log_softmax(student / temperature, dim=-1)
        return _decoupled(teacher - student, weights, soft_labels, log_probs, mse_weight, ce_weight)

    return rows
