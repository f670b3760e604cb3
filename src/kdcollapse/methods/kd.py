"""Vanilla knowledge distillation (Hinton et al., 2015) with the mdistiller CIFAR-100 defaults."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import kd_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, check_config


@register_method("kd")
class KD(Distiller):
    """ce_weight·CE(z_s, y) + kd_weight·τ²·KL(softmax(z_t/τ) ‖ softmax(z_s/τ)).

    Logged parts: ``ce`` and ``kd``, each already weighted (they sum to ``loss``).
    """

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(temperature=config.temperature)  # softmax(z_t / τ) only: top-k may be stored

    @dataclass
    class Config:
        temperature: float = 4.0  # τ
        ce_weight: float = 0.1  # weight of the cross-entropy with the labels
        kd_weight: float = 0.9  # weight of the τ²-scaled KL to the teacher

        def __post_init__(self):
            check_config(self, positive=("temperature",), non_negative=("ce_weight", "kd_weight"))

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        kd = cfg.kd_weight * kd_loss(logits, self.teacher_logits(x), cfg.temperature)
        return {"loss": ce + kd, "logits": logits, "ce": ce, "kd": kd}
