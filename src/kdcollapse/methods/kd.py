"""Vanilla knowledge distillation (Hinton et al., 2015) with the mdistiller CIFAR-100 defaults."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import kd_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import Distiller, check_config, loss, softmax_request, standardized


def equals(m, x, y):
    """ce_weight·CE + kd_weight·kd(τ) on the (standardised) logits."""
    cfg, logits = m.config, m.student(x)
    return (cfg.ce_weight * m.cross_entropy(logits, y)
            + cfg.kd_weight * loss("kd")(*standardized(cfg, logits, m.teacher_logits(x)), cfg.temperature))


@register_method("kd", equals=equals, checks=({"logit_standardization": True},))
class KD(Distiller):
    """ce_weight·CE(z_s, y) + kd_weight·τ²·KL(softmax(z_t/τ) ‖ softmax(z_s/τ)).

    With ``logit_standardization`` both logits are z-scored per sample before the KL (Sun et al. 2024).
    Logged parts: ``ce`` and ``kd``, each already weighted (they sum to ``loss``).
    """

    @classmethod
    def teacher_request(cls, config):
        return softmax_request(config)

    @dataclass
    class Config:
        temperature: float = 4.0  # τ
        ce_weight: float = 0.1  # weight of the cross-entropy with the labels
        kd_weight: float = 0.9  # weight of the τ²-scaled KL to the teacher
        logit_standardization: bool = False  # z-score both logits first (Sun et al. 2024; they use temperature=2, kd_weight=9)

        def __post_init__(self):
            check_config(self, positive=("temperature",), non_negative=("ce_weight", "kd_weight"))

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        kd = cfg.kd_weight * kd_loss(*standardized(cfg, logits, self.teacher_logits(x)), cfg.temperature)
        return {"loss": ce + kd, "logits": logits, "ce": ce, "kd": kd}
