"""Losses on the batch's sample-to-sample similarities: similarity-preserving KD (SP, Tung & Mori,
ICCV 2019) and probabilistic knowledge transfer (PKT, Passalis & Tefas, ECCV 2018)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._reduce import accumulation_dtype, validating
from kdcollapse.losses._shapes import check_tensor, check_values

_PKT_EPS = 1e-7  # the official code's guard, in the norms and inside the logarithm


def _pair(student: Tensor, teacher: Tensor, ndims: tuple[int, ...], validate: bool | None) -> tuple[Tensor, Tensor]:
    """Both sides checked, flattened to (B, ·) and upcast; the batch sizes must agree."""
    check_tensor("student", student, ndims)
    check_tensor("teacher", teacher, ndims)
    if student.shape[0] != teacher.shape[0]:
        raise KdcollapseError(f"batch sizes differ: student {tuple(student.shape)}, teacher {tuple(teacher.shape)}")
    if validating(validate):
        check_values({"student": student, "teacher": teacher})
    dtype = accumulation_dtype(student, teacher)
    return student.flatten(1).to(dtype), teacher.detach().flatten(1).to(dtype)


@register_loss("sp", kind="features", paper="Tung & Mori 2019, Similarity-preserving knowledge distillation (ICCV)",
               equation="(1/B²)·‖G̃_t − G̃_s‖²_F, G̃ = row-normalised F Fᵀ (eqs. 2-4)", temperature=False,
               sequences=False, ignore_index=False, chunked=False,
               inputs=lambda: example_tensors((6, 3, 2, 2), (6, 4, 2, 2)),
               reference=_references.sp)
def sp_loss(student: Tensor, teacher: Tensor, *, validate: bool | None = None) -> Tensor:
    """(1/B²)·‖G̃_T − G̃_S‖²_F with G = F Fᵀ of the flattened features and G̃ its rows L2-normalised
    (SP eq. 2-4).

    ``student`` and ``teacher``: (B, ...) activations of one layer each (mdistiller: the last stage's
    map), flattened per sample, so the shapes may differ beyond the batch. mdistiller weights it by 3000
    on CIFAR-100 (the method applies it). The teacher side carries no gradient. Half inputs accumulate
    in float32.
    """
    f_s, f_t = _pair(student, teacher, (2, 3, 4), validate)
    g_s, g_t = F.normalize(f_s @ f_s.T), F.normalize(f_t @ f_t.T)
    return (g_t - g_s).pow(2).sum() / f_s.shape[0] ** 2


def _conditional_probabilities(f: Tensor) -> Tensor:
    """PKT eq. 10 with the cosine kernel: row-normalised (1 + cos(f_i, f_j)) / 2."""
    f = f / (f.norm(dim=1, keepdim=True) + _PKT_EPS)
    similarity = (f @ f.T + 1) / 2
    return similarity / similarity.sum(1, keepdim=True)


@register_loss("pkt", kind="features", paper="Passalis & Tefas 2018, Learning deep representations with "
               "probabilistic knowledge transfer (ECCV)", equation="mean_ij p_ij log((p_ij + ε)/(q_ij + ε)), "
               "cosine-kernel conditional probabilities (eqs. 10-12)", temperature=False, sequences=False,
               ignore_index=False, chunked=False, inputs=lambda: example_tensors((6, 4), (6, 3)),
               reference=_references.pkt)
def pkt_loss(student: Tensor, teacher: Tensor, *, validate: bool | None = None) -> Tensor:
    """mean_{i,j} p_ij·log((p_ij + ε)/(q_ij + ε)), p (teacher) and q (student) the conditional
    probabilities of PKT eq. 10 with the cosine-similarity kernel (PKT eq. 12), ε = 1e-7.

    ``student`` (B, d_s) and ``teacher`` (B, d_t): penultimate features (mdistiller: the pooled
    feature). The official code divides by the norm plus ε and sets NaNs to 0 afterwards, which only a
    NaN input can produce; here a NaN input is an error (when validating). The mean runs over all B²
    entries, as the official ``torch.mean``. mdistiller weights it by 30000 on CIFAR-100 (the method
    applies it). The teacher side carries no gradient. Half inputs accumulate in float32.
    """
    f_s, f_t = _pair(student, teacher, (2,), validate)
    q, p = _conditional_probabilities(f_s), _conditional_probabilities(f_t)
    return torch.mean(p * torch.log((p + _PKT_EPS) / (q + _PKT_EPS)))
