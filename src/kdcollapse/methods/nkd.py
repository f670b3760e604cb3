"""Normalized knowledge distillation, NKD (Yang et al., ICCV 2023), with the official ImageNet defaults."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import nkd_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import Distiller, check_config, loss


def equals(m, x, y):
    """ce_weight·CE + nkd_weight·nkd(z_s, z_t, …)."""
    cfg, logits = m.config, m.student(x)
    distill = loss("nkd")(logits, m.teacher_logits(x), y, cfg.temperature, cfg.gamma)
    return cfg.ce_weight * m.cross_entropy(logits, y) + cfg.nkd_weight * distill


@register_method("nkd", equals=equals)
class NKD(Distiller):
    """ce_weight·CE(z_s, y) + nkd_weight·NKD(z_s, z_t, y) (NKD paper eq. 8, :func:`~kdcollapse.losses.nkd_loss`).

    Defaults from the official cls_KD ImageNet config (``res34_distill_res18_img.py``: τ = 1, γ = 1.5,
    the student's own cross-entropy at weight 1). Logit standardization is not defined for NKD: its
    authors normalise the non-target distribution instead. Logged parts: ``ce``, ``nkd`` (weighted).
    """

    @dataclass
    class Config:
        temperature: float = 1.0  # τ of the normalized non-target term
        gamma: float = 1.5  # weight γ of the non-target term
        ce_weight: float = 1.0
        nkd_weight: float = 1.0

        def __post_init__(self):
            check_config(self, positive=("temperature",), non_negative=("gamma", "ce_weight", "nkd_weight"))

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        nkd = cfg.nkd_weight * nkd_loss(logits, self.teacher_logits(x), y, cfg.temperature, cfg.gamma)
        return {"loss": ce + nkd, "logits": logits, "ce": ce, "nkd": nkd}
