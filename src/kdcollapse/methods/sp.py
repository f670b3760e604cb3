"""Similarity-preserving knowledge distillation (Tung & Mori, ICCV 2019), with mdistiller's CIFAR-100
settings (``CFG.SP``: CE 1, SP 3000; the last stage, ``feats[-1]``)."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import sp_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import loss
from kdcollapse.methods._stages import StageTransfer, check_weights, stage_maps, stages


def equals(m, x, y):
    """ce_weight·CE + feat_weight·sp over the paired student and teacher stage maps."""
    cfg, (logits, s_maps, t_maps) = m.config, stage_maps(m, x)
    distill = sum(loss("sp")(s, t) for s, t in zip(s_maps, t_maps))
    return cfg.ce_weight * m.cross_entropy(logits, y) + cfg.feat_weight * distill


@register_method("sp", equals=equals)
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
