"""ReviewKD's hierarchical context loss (Chen, Liu, Zhao & Jia, "Distilling Knowledge via Knowledge
Review", CVPR 2021, §3.3), as the official code defines it (dvlab-research/ReviewKD ``hcl``, copied by
mdistiller ``distillers/ReviewKD.py hcl_loss``).

For each stage, the student's fused map F_s and the teacher's map F_t (both (B, C, H, W)) are compared at
full resolution and after adaptive average pooling to 4×4, 2×2 and 1×1, skipping every level that is not
smaller than H; the i-th level kept gets weight 2^-i and the stage's loss is divided by the total weight:

    HCL_stage = [MSE(F_s, F_t) + Σ_i 2^-i · MSE(pool_i(F_s), pool_i(F_t))] / (1 + Σ_i 2^-i),

with MSE the mean over all entries. ReviewKD's loss is the sum over stages of :func:`hcl_loss`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import _references
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses._reduce import accumulation_dtype, validating
from kdcollapse.losses._shapes import check_tensor, check_values

HCL_LEVELS = (4, 2, 1)  # the official pooled sizes


@register_loss("hcl", kind="features", paper="Chen, Liu, Zhao & Jia 2021, Distilling knowledge via knowledge "
               "review (CVPR)", equation="[MSE + Σ_i 2^-i·MSE(pool_i)] / (1 + Σ_i 2^-i), §3.3",
               temperature=False, sequences=False, ignore_index=False, chunked=False,
               inputs=lambda: example_tensors((2, 3, 8, 8), (2, 3, 8, 8)),
               reference=_references.hcl)
def hcl_loss(student: Tensor, teacher: Tensor, levels: Sequence[int] = HCL_LEVELS, *,
             validate: bool | None = None) -> Tensor:
    """The hierarchical context loss of one stage (module docstring) for (B, C, H, W) maps of equal shape;
    ReviewKD sums it over its stages. The teacher side gets gradients if it carries any (a frozen
    teacher's maps do not)."""
    check_tensor("student", student, (4,))
    check_tensor("teacher", teacher, (4,))
    if student.shape != teacher.shape:
        raise KdcollapseError(f"student and teacher maps must have the same shape (B, C, H, W), got "
                              f"{tuple(student.shape)} and {tuple(teacher.shape)}")
    if validating(validate):
        check_values({"student": student, "teacher": teacher})
    dtype = accumulation_dtype(student, teacher)
    s, t = student.to(dtype), teacher.to(dtype)
    loss, weight, total = F.mse_loss(s, t), 1.0, 1.0
    for size in levels:
        if size >= s.shape[2]:
            continue
        weight /= 2.0
        loss = loss + weight * F.mse_loss(F.adaptive_avg_pool2d(s, size), F.adaptive_avg_pool2d(t, size))
        total += weight
    return loss / total
