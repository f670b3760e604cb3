"""Decoupled knowledge distillation (Zhao et al., CVPR 2022) with the mdistiller CIFAR-100 defaults."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.errors import ConfigError
from kdcollapse.losses import dkd_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, check_config, warmup_factor


@register_method("dkd")
class DKD(Distiller):
    """ce_weight·CE(z_s, y) + min(epoch/warmup, 1)·τ²·(α·TCKD + β·NCKD) (DKD paper eq. 5).

    The ramp is per epoch and counts epochs from 1, as mdistiller's ``DKD.forward_train`` does
    (``min(epoch / WARMUP, 1)``, epoch 1 of 20 weighted 1/20). NCKD compares distributions over the
    K − 1 non-target classes, so DKD needs K ≥ 3. Logged parts: ``ce`` and ``dkd`` (weighted and ramped).
    """

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(temperature=config.temperature)  # softmax(z_t / τ) only: top-k may be stored

    @dataclass
    class Config:
        alpha: float = 1.0  # TCKD weight
        beta: float = 8.0  # NCKD weight (mdistiller: 2 for res56/res110 pairs, 6 for WRN/VGG pairs)
        temperature: float = 4.0  # τ
        ce_weight: float = 1.0
        warmup_epochs: int = 20  # linear ramp of the DKD term over the first epochs; 0: none

        def __post_init__(self):
            check_config(self, positive=("temperature",),
                         non_negative=("alpha", "beta", "ce_weight", "warmup_epochs"))

    def __init__(self, student, config, *, num_classes, **kwargs):
        if num_classes < 3:
            raise ConfigError(f"method 'dkd' needs at least 3 classes (NCKD compares the K - 1 non-target "
                              f"classes), the data has {num_classes}; use method.name=kd")
        super().__init__(student, config, num_classes=num_classes, **kwargs)

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        dkd = warmup_factor(self.epoch, cfg.warmup_epochs) * dkd_loss(
            logits, self.teacher_logits(x), y, cfg.alpha, cfg.beta, cfg.temperature)
        return {"loss": ce + dkd, "logits": logits, "ce": ce, "dkd": dkd}
