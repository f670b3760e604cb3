"""DIST: knowledge distillation from a stronger teacher (Huang et al., NeurIPS 2022), logits only.

Defaults are the official CIFAR-100 configuration
(``hunto/image_classification_sota/configs/strategies/distill/dist_cifar.yaml``: ``kd: dist_t4``,
``ori_loss_weight: 1``, ``kd_loss_weight: 2``, β = γ = 1); the official ImageNet configuration
(``resnet_dist.yaml``) differs only in τ = 1. The official code has no warm-up of the DIST term.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import dist_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import Distiller, check_config, loss


def equals(m, x, y):
    """ce_weight·CE + kd_weight·dist(z_s, z_t, …)."""
    cfg, logits = m.config, m.student(x)
    dist = loss("dist")(logits, m.teacher_logits(x), cfg.beta, cfg.gamma, cfg.temperature)
    return cfg.ce_weight * m.cross_entropy(logits, y) + cfg.kd_weight * dist


@register_method("dist", equals=equals)
class DIST(Distiller):
    """ce_weight·CE(z_s, y) + kd_weight·τ²·(β·inter-class + γ·intra-class relation loss) (DIST eq. 7).

    The relations are Pearson correlations of softmax(z/τ) between student and teacher, per sample
    across classes and per class across the batch (:func:`kdcollapse.losses.dist_loss`), so the
    batch is the unit of the intra-class term. Logged parts: ``ce`` and ``dist``, each weighted (they
    sum to ``loss``).
    """

    @dataclass
    class Config:
        beta: float = 1.0  # weight of the inter-class relation (each sample's K probabilities)
        gamma: float = 1.0  # weight of the intra-class relation (each class's B probabilities)
        temperature: float = 4.0  # τ: 4 on CIFAR-100 (dist_t4), 1 on ImageNet
        ce_weight: float = 1.0  # official ori_loss_weight
        kd_weight: float = 2.0  # official kd_loss_weight

        def __post_init__(self):
            check_config(self, positive=("temperature",),
                         non_negative=("beta", "gamma", "ce_weight", "kd_weight"))

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        dist = cfg.kd_weight * dist_loss(logits, self.teacher_logits(x), cfg.beta, cfg.gamma, cfg.temperature)
        return {"loss": ce + dist, "logits": logits, "ce": ce, "dist": dist}
