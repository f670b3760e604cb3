"""Relational knowledge distillation (Park et al., CVPR 2019), as the authors' code defines it."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._reduce import accumulation_dtype, check_reduction, validating
from kdcollapse.losses._shapes import check_tensor, check_values

_EPS = 1e-12


def _relations(e: Tensor) -> tuple[Tensor, Tensor]:
    """Distances normalised by their mean positive value (B, B) and angles (B, B, B).

    angle[i, j, k] = ⟨unit(e_j − e_i), unit(e_k − e_i)⟩, with unit(0) = 0 for coincident points,
    computed as B batched (B×d)(d×B) matmuls on the (B, B, d) difference tensor.
    """
    diff = e.unsqueeze(0) - e.unsqueeze(1)  # diff[i, j] = e_j − e_i
    dist = diff.norm(dim=-1)
    positive = (dist > 0).sum().clamp_min(1)
    unit = diff / dist.clamp_min(_EPS).unsqueeze(-1)
    return dist / (dist.sum() / positive).clamp_min(_EPS), torch.bmm(unit, unit.transpose(1, 2))


@register_loss("rkd", kind="features", paper="Park et al. 2019, Relational knowledge distillation (CVPR)",
               equation="λ_D·RKD-D + λ_A·RKD-A (eqs. 3-6)", temperature=False, sequences=False,
               ignore_index=False, chunked=False, inputs=lambda: example_tensors((6, 4), (6, 3)),
               reference=_references.rkd)
def rkd_loss(student_embeddings: Tensor, teacher_embeddings: Tensor, distance_weight: float = 25.0,
             angle_weight: float = 50.0, *, reduction: str = "mean",
             validate: bool | None = None) -> Tensor:
    """distance_weight · RKD-D + angle_weight · RKD-A (Park et al. 2019; the official weights).

    RKD-D: smooth-L1 (δ = 1) between the student's and the teacher's pairwise Euclidean distances,
    each divided by its mean over the positive distances, averaged over all B×B pairs. RKD-A:
    smooth-L1 between the cosines of the angles ∠(e_j − e_i, e_k − e_i), averaged over all B³
    triplets. The teacher side carries no gradient. Embeddings are (B, d) and may differ in d.
    Memory is O(B²d + B³). ``reduction="none"`` gives per-anchor values (B,): anchor i's mean over
    its B pairs (i, j) and B² triplets (i, j, k), weighted as above, so their mean is the loss and
    "sum" is B times it. Half inputs accumulate in float32.
    """
    check_reduction(reduction)
    check_tensor("student_embeddings", student_embeddings, (2,))
    check_tensor("teacher_embeddings", teacher_embeddings, (2,))
    if student_embeddings.shape[0] != teacher_embeddings.shape[0]:
        raise KdcollapseError(f"batch sizes differ: student_embeddings has "
                              f"{student_embeddings.shape[0]} rows, teacher_embeddings "
                              f"{teacher_embeddings.shape[0]}")
    if validating(validate):
        check_values({"student_embeddings": student_embeddings,
                      "teacher_embeddings": teacher_embeddings})
    dtype = accumulation_dtype(student_embeddings, teacher_embeddings)
    dist_s, angle_s = _relations(student_embeddings.to(dtype))
    with torch.no_grad():
        dist_t, angle_t = _relations(teacher_embeddings.to(dtype))
    if reduction == "mean":
        return (distance_weight * F.smooth_l1_loss(dist_s, dist_t, beta=1.0)
                + angle_weight * F.smooth_l1_loss(angle_s, angle_t, beta=1.0))
    distance = F.smooth_l1_loss(dist_s, dist_t, reduction="none").mean(-1)
    angle = F.smooth_l1_loss(angle_s, angle_t, reduction="none").mean((-2, -1))
    per_anchor = distance_weight * distance + angle_weight * angle
    return per_anchor.sum() if reduction == "sum" else per_anchor
