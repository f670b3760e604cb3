"""Variational Information Distillation (Ahn, Hu, Damianou, Lawrence & Dai, CVPR 2019), §3, as the
authors' code (ssahn0215/variational-information-distillation) and mdistiller ``distillers/VID.py``
compute it.

The teacher's map t (B, C, H, W) is modelled as a Gaussian whose mean μ(s) a small regressor predicts
from the student's map and whose per-channel variance is σ_c² = softplus(α_c) + ε. The loss is the
negative log-likelihood without its constant, averaged over every entry:

    L = mean_{b,c,h,w} ½ [ (μ_{bchw} − t_{bchw})² / σ_c² + log σ_c² ].
"""

from __future__ import annotations

import math

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import _references
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses._reduce import accumulation_dtype, validating
from kdcollapse.losses._shapes import check_tensor, check_values

VID_EPS = 1e-5  # the official floor of the variance


@register_loss("vid", kind="features", paper="Ahn, Hu, Damianou, Lawrence & Dai 2019, Variational information "
               "distillation for knowledge transfer (CVPR)", equation="mean ½[(μ − t)²/σ_c² + log σ_c²], "
               "σ_c² = softplus(α_c) + ε, §3", temperature=False, sequences=False, ignore_index=False,
               chunked=False, inputs=lambda: example_tensors((2, 3, 4, 4), (2, 3, 4, 4), (3,)),
               reference=_references.vid)
def vid_loss(predicted_mean: Tensor, teacher: Tensor, log_scale: Tensor, eps: float = VID_EPS, *,
             validate: bool | None = None) -> Tensor:
    """The Gaussian NLL above; ``log_scale`` (C,) holds α, σ² = softplus(α) + ``eps``.

    ``predicted_mean`` and ``teacher`` are (B, C, H, W) of the same shape (pool the larger student or
    teacher map first, see :func:`match_spatial_size`).
    """
    check_tensor("predicted_mean", predicted_mean, (4,))
    check_tensor("teacher", teacher, (4,))
    check_tensor("log_scale", log_scale, (1,))
    if predicted_mean.shape != teacher.shape or log_scale.shape[0] != teacher.shape[1]:
        raise KdcollapseError(f"predicted_mean and teacher must have the same shape (B, C, H, W) and "
                              f"log_scale shape (C,), got {tuple(predicted_mean.shape)}, "
                              f"{tuple(teacher.shape)} and {tuple(log_scale.shape)}")
    if validating(validate):
        check_values({"predicted_mean": predicted_mean, "teacher": teacher, "log_scale": log_scale})
    dtype = accumulation_dtype(predicted_mean, teacher, log_scale)
    variance = (F.softplus(log_scale.to(dtype)) + eps).view(1, -1, 1, 1)
    return 0.5 * ((predicted_mean.to(dtype) - teacher.to(dtype)) ** 2 / variance + variance.log()).mean()


def vid_initial_log_scale(variance: float = 5.0, eps: float = VID_EPS) -> float:
    """α with softplus(α) + eps = ``variance``: the official initial value (variance 5)."""
    if not variance > eps:
        raise KdcollapseError(f"variance must be > eps = {eps}, got {variance}")
    return math.log(math.expm1(variance - eps))


def match_spatial_size(student: Tensor, teacher: Tensor) -> tuple[Tensor, Tensor]:
    """Average-pool the larger of two (B, C, H, W) maps to the other's H×W (VID's dimension match)."""
    if student.shape[-2:] == teacher.shape[-2:]:
        return student, teacher
    if student.shape[-2] > teacher.shape[-2]:
        return F.adaptive_avg_pool2d(student, teacher.shape[-2:]), teacher
    return student, F.adaptive_avg_pool2d(teacher, student.shape[-2:])
