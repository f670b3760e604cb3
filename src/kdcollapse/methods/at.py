"""Attention transfer (Zagoruyko & Komodakis, ICLR 2017), activation-based, with mdistiller's CIFAR-100 and
ImageNet settings (``CFG.AT``: p = 2, β = 1000, CE 1; the stages after the stem, ``feats[1:]``)."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import at_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import check_config
from kdcollapse.methods._distill import loss
from kdcollapse.methods._stages import StageTransfer, check_weights, stage_maps, stages


def equals(m, x, y):
    """ce_weight·CE + feat_weight·at over the paired student and teacher stage maps."""
    cfg, (logits, s_maps, t_maps) = m.config, stage_maps(m, x)
    return cfg.ce_weight * m.cross_entropy(logits, y) + cfg.feat_weight * loss("at")(s_maps, t_maps, cfg.p)


@register_method("at", equals=equals)
class AT(StageTransfer):
    """ce_weight·CE + feat_weight·Σ_stages mean (Q_s/‖Q_s‖ − Q_t/‖Q_t‖)² (AT eq. 2, β = 1000 as published;
    :func:`kdcollapse.losses.at_loss`). Logged parts: ``ce``, ``at``, weighted."""

    part = "at"

    @dataclass
    class Config:
        ce_weight: float = 1.0  # mdistiller CFG.AT.LOSS.CE_WEIGHT
        feat_weight: float = 1000.0  # β (CFG.AT.LOSS.FEAT_WEIGHT)
        p: float = 2.0  # attention map = channel mean of |A|^p (CFG.AT.P)
        student_stages: list[int] = stages(1, 2, 3)  # mdistiller feats[1:] of the CIFAR ResNets and WRNs
        teacher_stages: list[int] = stages(1, 2, 3)

        def __post_init__(self):
            check_config(self, positive=("p",))
            check_weights(self)

    @staticmethod
    def loss_fn(student_maps, teacher_maps, config):
        return at_loss(student_maps, teacher_maps, config.p)
