"""Contrastive Representation Distillation (Tian, Krishnan & Isola, ICLR 2020), as its code defines it.

CRD compares an anchor embedding v (B, d), unit-norm, with 1 + K rows of a memory bank of the other
network's embeddings of the whole training set: row 0 the anchor's own sample (the positive), rows
1..K samples of other classes (the negatives). Its score is the un-normalised probability

    P(i | v) = exp(m_i · v / τ) / Z,

with Z a constant, N times the mean of exp(m_i · v / τ) over the first batch (a Monte-Carlo estimate of
the partition function over the N samples). The loss is NCE against the uniform noise distribution
P_n = 1 / N (the paper's critic h = P / (P + K·P_n) and its NCE bound, §3):

    L = −(1/B) Σ_b [ log P_0 / (P_0 + K/N + ε) + Σ_{i=1..K} log (K/N) / (P_i + K/N + ε) ],   ε = 1e-7.

CRD applies it in both directions (teacher memory against the student anchor and student memory
against the teacher anchor) and adds the two. The memory rows are updated after each step with momentum
and renormalised (:func:`crd_memory_update`). The constants are those of the official code
(RepDistiller, copied by mdistiller ``distillers/CRD.py``): τ = 0.07, K = 16384, momentum 0.5,
ε = 1e-7 inside the denominators only.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import _references
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses._reduce import accumulation_dtype, validating
from kdcollapse.losses._shapes import check_positive, check_tensor, check_values

NCE_EPS = 1e-7  # the official ContrastLoss' eps, added to the denominators only


def _check_rows(anchors: Tensor, memory_rows: Tensor) -> None:
    check_tensor("anchors", anchors, (2,))
    check_tensor("memory_rows", memory_rows, (3,))
    batch, dim = anchors.shape
    if memory_rows.shape[0] != batch or memory_rows.shape[2] != dim or memory_rows.shape[1] < 2:
        raise KdcollapseError(f"memory_rows must have shape (B, 1 + K, d) = ({batch}, 1 + K, {dim}) with "
                              f"K >= 1, got {tuple(memory_rows.shape)}")


def crd_log_scores(anchors: Tensor, memory_rows: Tensor, temperature: float = 0.07) -> Tensor:
    """m_i · v / τ for each anchor v (B, d) and its memory rows (B, 1 + K, d): (B, 1 + K)."""
    check_positive("temperature", temperature)
    _check_rows(anchors, memory_rows)
    dtype = accumulation_dtype(anchors, memory_rows)
    return torch.einsum("bkd,bd->bk", memory_rows.to(dtype), anchors.to(dtype)) / temperature


def crd_normalizer(log_scores: Tensor, num_data: int | Tensor) -> float:
    """Z = N · mean exp(m · v / τ) over a batch's (B, 1 + K) ``log_scores``: the constant CRD fixes at its
    first step, per direction. Read once (a host synchronisation), without gradient, as the official code
    does with ``.item()``."""
    n = _num_data(num_data)
    with torch.no_grad():
        return float(log_scores.exp().mean()) * n


@register_loss("crd", kind="features", paper="Tian, Krishnan & Isola 2020, Contrastive representation "
               "distillation (ICLR)", equation="NCE with P_n = 1/N: −Σ log P₀/(P₀+K/N) − Σ_i log (K/N)/(P_i+K/N)",
               temperature=True, sequences=False, ignore_index=False, chunked=False, compiles=False,
               notes="N and the first-step Z are host numbers", inputs=lambda: (
                   *(F.normalize(x, dim=-1) for x in example_tensors((4, 8), (4, 6, 8))), torch.tensor(50)),
               reference=_references.crd)
def crd_loss(anchors: Tensor, memory_rows: Tensor, num_data: int | Tensor, normalizer: float | None = None,
             temperature: float = 0.07, *, validate: bool | None = None) -> Tensor:
    """The NCE loss of one CRD direction (module docstring); row 0 of ``memory_rows`` is the positive.

    ``anchors`` (B, d) are one network's embeddings (unit-norm in CRD), ``memory_rows`` (B, 1 + K, d) the
    other network's memory rows drawn for them, ``num_data`` N the size of the memory bank (an int or a
    0-dim integer tensor), ``normalizer`` Z from :func:`crd_normalizer` (``None``: estimated from this
    batch, which is what the official code does at its first step). Gradients reach ``anchors`` (and
    ``memory_rows`` if they carry any; the official code detaches them). :func:`crd_nce_loss` on
    :func:`crd_log_scores`.
    """
    log_scores = crd_log_scores(anchors, memory_rows, temperature)
    if validating(validate):
        check_values({"anchors": anchors, "memory_rows": memory_rows})
    return crd_nce_loss(log_scores, num_data, normalizer, validate=False)  # finite inputs: finite scores


@register_loss("crd_nce", kind="features", paper="Tian, Krishnan & Isola 2020, Contrastive representation "
               "distillation (ICLR)", equation="the NCE of crd on scores s_i = m_i·v/τ, P_i = e^{s_i}/Z",
               temperature=False, sequences=False, ignore_index=False, chunked=False, compiles=False,
               notes="N and the first-step Z are host numbers",
               inputs=lambda: (*example_tensors((4, 7)), torch.tensor(50)),
               reference=_references.crd_nce)
def crd_nce_loss(log_scores: Tensor, num_data: int | Tensor, normalizer: float | None = None, *,
                 validate: bool | None = None) -> Tensor:
    """CRD's NCE loss from the (B, 1 + K) scores m_i · v / τ, positive in column 0 (``normalizer``,
    ``num_data`` as in :func:`crd_loss`).

    log P = score − log Z; log P − logaddexp(log P, log(K/N + ε)) equals the official
    log(P / (P + K/N + ε)) and cannot overflow. A sum over the 1 + K terms and a mean over the batch, as
    in the official code.
    """
    check_tensor("log_scores", log_scores, (2,))
    if log_scores.shape[1] < 2:
        raise KdcollapseError(f"log_scores must have shape (B, 1 + K) with K >= 1, got {tuple(log_scores.shape)}")
    if validating(validate):
        check_values({"log_scores": log_scores})
    n = _num_data(num_data)
    normalizer = crd_normalizer(log_scores, n) if normalizer is None else normalizer
    check_positive("normalizer", normalizer)
    dtype = accumulation_dtype(log_scores)
    log_p = log_scores.to(dtype) - math.log(normalizer)
    noise = (log_scores.shape[1] - 1) / n  # K · P_n
    log_denominator = torch.logaddexp(log_p, log_p.new_tensor(math.log(noise + NCE_EPS)))
    log_d1 = log_p[:, 0] - log_denominator[:, 0]  # positive: P / (P + K/N + ε)
    log_d0 = math.log(noise) - log_denominator[:, 1:]  # negatives: (K/N) / (P + K/N + ε)
    return -(log_d1.sum() + log_d0.sum()) / log_scores.shape[0]


def _num_data(num_data: int | Tensor) -> int:
    if isinstance(num_data, Tensor) and num_data.dim() == 0 and not num_data.is_floating_point():
        num_data = int(num_data)
    if not (isinstance(num_data, int) and num_data > 0):
        raise KdcollapseError(f"num_data must be a positive int (the training-set size), got {num_data!r}")
    return num_data


def crd_memory_update(rows: Tensor, embeddings: Tensor, momentum: float = 0.5) -> Tensor:
    """normalize(momentum · rows + (1 − momentum) · embeddings): the new memory rows of a batch's samples.

    ``rows`` (B, d) are the memory rows at the batch's sample indices, ``embeddings`` (B, d) the batch's
    new embeddings (detached here). The result is unit-norm whatever the inputs' norms; the caller writes
    it back at the same indices. Pure: nothing is modified in place.
    """
    if not 0.0 <= momentum <= 1.0:
        raise KdcollapseError(f"momentum must be in [0, 1], got {momentum}")
    check_tensor("rows", rows, (2,))
    check_tensor("embeddings", embeddings, (2,))
    if rows.shape != embeddings.shape:
        raise KdcollapseError(f"rows and embeddings must have the same shape (B, d), got {tuple(rows.shape)} "
                              f"and {tuple(embeddings.shape)}")
    mixed = momentum * rows + (1.0 - momentum) * embeddings.detach().to(rows.dtype)
    return F.normalize(mixed, dim=1)
