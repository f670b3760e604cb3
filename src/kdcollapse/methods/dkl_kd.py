"""DKL as the distillation loss (DKL paper eq. 5 with a frozen teacher, Table 1 row b)."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import dkl_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import Distiller, check_config


@register_method("dkl_kd")
class DKLKD(Distiller):
    """ce_weight·CE(z_s, y) + kd_weight·τ²·DKL(z_t/τ, z_s/τ; α, β) (DKL paper eq. 5).

    With α = β = 1 the gradients equal those of the ``kd`` method (Lemma 1): the teacher is frozen, so
    the wMSE term has no gradient (the paper's eq. 6 "asymmetry") and only the soft-label CE acts. It is
    the control for ``ikl_kd``, which breaks that asymmetry. Logged parts: ``ce``, ``dkl``.
    """

    @dataclass
    class Config:
        temperature: float = 4.0  # τ
        ce_weight: float = 0.1
        kd_weight: float = 0.9
        alpha: float = 1.0  # wMSE weight (inactive with a frozen teacher)
        beta: float = 1.0  # soft-label CE weight

        def __post_init__(self):
            check_config(self, positive=("temperature",),
                         non_negative=("ce_weight", "kd_weight", "alpha", "beta"))

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        tau = cfg.temperature
        dkl = cfg.kd_weight * tau**2 * dkl_loss(self.teacher_logits(x) / tau, logits / tau, cfg.alpha, cfg.beta)
        return {"loss": ce + dkl, "logits": logits, "ce": ce, "dkl": dkl}
