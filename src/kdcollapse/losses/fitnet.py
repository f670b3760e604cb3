"""FitNets: hints for thin deep nets (Romero et al., ICLR 2015), the hint loss."""

from __future__ import annotations

from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._maps import paired_stages
from kdcollapse.losses._reduce import validating
from kdcollapse.losses._shapes import check_values


@register_loss("fitnet", kind="features", paper="Romero et al. 2015, FitNets: hints for thin deep nets (ICLR)",
               equation="mean (r(v_s) − u_t)², the hint loss (eq. 3) as mdistiller averages it", temperature=False,
               sequences=False, ignore_index=False, chunked=False,
               inputs=lambda: example_tensors((4, 3, 2, 2), (4, 3, 2, 2)),
               reference=_references.fitnet)
def fitnet_loss(student_regressed: Tensor, teacher_hint: Tensor, *, validate: bool | None = None) -> Tensor:
    """mean over all entries of (r(v_s) − u_t)², the hint loss of FitNets eq. 3.

    ``student_regressed`` is the student's guided layer after the regressor r (a (B, C, H, W) map with
    the teacher's shape; the method owns r), ``teacher_hint`` the teacher's hint layer u_t. The paper
    writes ½‖u_t − r(v_s)‖²; mdistiller's ``FitNet`` takes the mean squared error over every entry
    (``F.mse_loss``) and weights it by 100 on CIFAR-100, which is what this computes. The teacher side
    carries no gradient. Half inputs accumulate in float32.
    """
    ((s, t),) = paired_stages(student_regressed, teacher_hint)
    if s.shape != t.shape:
        raise KdcollapseError(f"student_regressed {tuple(s.shape)} and teacher_hint {tuple(t.shape)} must have "
                              f"one shape: the regressor maps the student's map onto the teacher's")
    if validating(validate):
        check_values({"student_regressed": s, "teacher_hint": t})
    return (s - t.detach()).pow(2).mean()
