"""Decoupled knowledge distillation (Zhao et al., CVPR 2022) with the mdistiller CIFAR-100 defaults."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.errors import ConfigError
from kdcollapse.losses import dkd_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import Distiller, check_config, loss, softmax_request, standardized, warmup_factor


def equals(m, x, y):
    """ce_weight·CE + warm-up·dkd(α, β, τ) on the (standardised) logits."""
    cfg, logits = m.config, m.student(x)
    dkd = loss("dkd")(*standardized(cfg, logits, m.teacher_logits(x)), y, cfg.alpha, cfg.beta, cfg.temperature)
    return cfg.ce_weight * m.cross_entropy(logits, y) + warmup_factor(m.epoch, cfg.warmup_epochs) * dkd


@register_method("dkd", equals=equals, checks=({"logit_standardization": True},))
class DKD(Distiller):
    """ce_weight·CE(z_s, y) + min(epoch/warmup, 1)·τ²·(α·TCKD + β·NCKD) (DKD paper eq. 5).

    The ramp is per epoch and counts epochs from 1, as mdistiller's ``DKD.forward_train`` does
    (``min(epoch / WARMUP, 1)``, epoch 1 of 20 weighted 1/20). NCKD compares distributions over the
    K − 1 non-target classes, so DKD needs K ≥ 3. With ``logit_standardization`` both logits are z-scored
    per sample first (Sun et al. 2024). Logged parts: ``ce`` and ``dkd`` (weighted and ramped).
    """

    @classmethod
    def teacher_request(cls, config):
        return softmax_request(config)

    @dataclass
    class Config:
        alpha: float = 1.0  # TCKD weight
        beta: float = 8.0  # NCKD weight (mdistiller: 2 for res56/res110 pairs, 6 for WRN/VGG pairs)
        temperature: float = 4.0  # τ
        ce_weight: float = 1.0
        warmup_epochs: int = 20  # linear ramp of the DKD term over the first epochs; 0: none
        logit_standardization: bool = False  # z-score both logits first (Sun et al. 2024; they use temperature=2, alpha and beta ×9)

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
            *standardized(cfg, logits, self.teacher_logits(x)), y, cfg.alpha, cfg.beta, cfg.temperature)
        return {"loss": ce + dkd, "logits": logits, "ce": ce, "dkd": dkd}
