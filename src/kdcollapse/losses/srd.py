"""SRD, the feature term of "Understanding the role of the projector in knowledge distillation" (Miles &
Mikolajczyk, AAAI 2024), as torchdistill's ``SRDLoss`` computes it (the reference of its official configs)."""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import _references
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses._reduce import validating
from kdcollapse.losses._shapes import check_positive, check_values


@register_loss("srd", kind="features",
               paper="Miles & Mikolajczyk 2024, Understanding the role of the projector in knowledge distillation "
                     "(AAAI)", equation="log Σ_ij |p_ij − q_ij|^α over batch and features, α = 4 (torchdistill SRDLoss)",
               temperature=False, sequences=False, ignore_index=False, chunked=False,
               inputs=lambda: example_tensors((4, 3), (4, 3)), reference=_references.srd)
def srd_loss(student_projected: Tensor, teacher_normalized: Tensor, exponent: float = 4.0, *,
             validate: bool | None = None) -> Tensor:
    """log of the sum over the batch and the features of |p − q|^exponent.

    ``student_projected``: the student's pooled feature through the linear projector and a BatchNorm without
    affine parameters (B, d_t); ``teacher_normalized``: the teacher's pooled feature through the same kind of
    BatchNorm (B, d_t). A sum, not a mean: the log makes the batch size an additive constant. The method
    (``kdcollapse.methods.srd``) weights it by 2, as ``SRDLoss`` does.
    """
    check_positive("exponent", exponent)
    if student_projected.shape != teacher_normalized.shape or student_projected.ndim != 2:
        raise KdcollapseError(f"srd_loss needs two (B, d) tensors of one shape, got {tuple(student_projected.shape)} "
                              f"and {tuple(teacher_normalized.shape)}")
    if validating(validate):
        check_values({"student_projected": student_projected, "teacher_normalized": teacher_normalized})
    student, teacher = (t if t.dtype == torch.float64 else t.float() for t in (student_projected, teacher_normalized))
    return (student - teacher).abs().pow(exponent).sum().log()
