"""Neuron selectivity transfer (Huang & Wang 2017), with mdistiller's CIFAR-100 settings (``CFG.NST``: CE 1,
NST 50; the stages after the stem, ``feats[1:]``)."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import nst_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import loss
from kdcollapse.methods._stages import StageTransfer, check_weights, stage_maps, stages


def equals(m, x, y):
    """ce_weight·CE + feat_weight·nst over the paired student and teacher stage maps."""
    cfg, (logits, s_maps, t_maps) = m.config, stage_maps(m, x)
    return cfg.ce_weight * m.cross_entropy(logits, y) + cfg.feat_weight * loss("nst")(s_maps, t_maps)


@register_method("nst", equals=equals)
class NST(StageTransfer):
    """ce_weight·CE + feat_weight·Σ_stages MMD² with the degree-2 polynomial kernel (NST eq. 4-6;
    :func:`kdcollapse.losses.nst_loss`). Logged parts: ``ce``, ``nst``, weighted."""

    part = "nst"

    @dataclass
    class Config:
        ce_weight: float = 1.0  # mdistiller CFG.NST.LOSS.CE_WEIGHT
        feat_weight: float = 50.0  # CFG.NST.LOSS.FEAT_WEIGHT
        student_stages: list[int] = stages(1, 2, 3)
        teacher_stages: list[int] = stages(1, 2, 3)

        def __post_init__(self):
            check_weights(self)

    @staticmethod
    def loss_fn(student_maps, teacher_maps, config):
        return nst_loss(student_maps, teacher_maps)
