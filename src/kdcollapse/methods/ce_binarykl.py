"""CE + BinaryKL on one head: the combination the Dual-Head KD paper shows collapsing (DHKD §3.1, eq. 2)."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import binary_kl_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import Distiller, check_config


@register_method("ce_binarykl")
class CEBinaryKL(Distiller):
    """ce_weight·CE(z_s, y) + alpha·BinaryKL(z_s, z_t, τ), both on the single head (DHKD eq. 2).

    The paper's baseline, not a recommended method: its Proposition 1 shows the BinaryKL gradient on the
    linear classifier opposing the CE one, and its Figure 2 shows the student collapsing. With
    ``ce_weight: 0`` it is the "BinaryKL only" setting of that figure. Logged parts: ``ce``, ``binary_kl``.
    """

    @dataclass
    class Config:
        alpha: float = 1.0  # BinaryKL weight
        temperature: float = 2.0  # τ (the DHKD paper's value)
        ce_weight: float = 1.0

        def __post_init__(self):
            check_config(self, positive=("temperature",), non_negative=("alpha", "ce_weight"))

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        bkl = cfg.alpha * binary_kl_loss(logits, self.teacher_logits(x), cfg.temperature)
        return {"loss": ce + bkl, "logits": logits, "ce": ce, "binary_kl": bkl}
