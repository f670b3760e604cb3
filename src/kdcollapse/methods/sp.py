"""Similarity-preserving knowledge distillation (Tung & Mori, ICCV 2019), with mdistiller's CIFAR-100
settings (``CFG.SP``: CE 1, SP 3000; the last stage, ``feats[-1]``)."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import sp_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._stages import StageTransfer, check_weights, stages


@register_method("sp")
class SP(StageTransfer):
    """ce_weight·CE + feat_weight·Σ_stages (1/B²)·‖G̃_t − G̃_s‖²_F on the last stage (SP eq. 4;
    :func:`kdcollapse.losses.sp_loss`). Logged parts: ``ce``, ``sp``, weighted."""

    part = "sp"

    @dataclass
    class Config:
        ce_weight: float = 1.0  # mdistiller CFG.SP.LOSS.CE_WEIGHT
        feat_weight: float = 3000.0  # CFG.SP.LOSS.FEAT_WEIGHT
        student_stages: list[int] = stages(-1)  # mdistiller feats[-1]
        teacher_stages: list[int] = stages(-1)

        def __post_init__(self):
            check_weights(self)

    @staticmethod
    def loss_fn(student_maps, teacher_maps, config):
        return sum(sp_loss(s, t) for s, t in zip(student_maps, teacher_maps))
