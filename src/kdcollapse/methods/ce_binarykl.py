"""CE + BinaryKL on one head: the combination the Dual-Head KD paper shows collapsing (DHKD §3.1, eq. 2)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from kdcollapse.losses import binary_kl_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import Distiller, check_config, loss


def equals(m, x, y):
    """ce_weight·CE + alpha·binary_kl(z_s, z_t, τ, form)."""
    cfg, logits = m.config, m.student(x)
    return (cfg.ce_weight * m.cross_entropy(logits, y)
            + cfg.alpha * loss("binary_kl")(logits, m.teacher_logits(x), cfg.temperature, form=cfg.binary_kl_form))


@register_method("ce_binarykl", equals=equals, checks=({"binary_kl_form": "official"},))
class CEBinaryKL(Distiller):
    """ce_weight·CE(z_s, y) + alpha·BinaryKL(z_s, z_t, τ), both on the single head (DHKD eq. 2).

    The paper's baseline, not a recommended method: its Proposition 1 shows the BinaryKL gradient on the
    linear classifier opposing the CE one, and its Figure 2 shows the student collapsing. With
    ``ce_weight: 0`` it is the "BinaryKL only" setting of that figure. ``binary_kl_form: official``
    uses the official code's clamped BinaryKL, which is inf/NaN in float32 once a student logit
    exceeds ≈ 16.6·τ (see ``docs/losses.md``). Logged parts: ``ce``, ``binary_kl``.
    """

    @dataclass
    class Config:
        alpha: float = 1.0  # BinaryKL weight
        temperature: float = 2.0  # τ (the DHKD paper's value)
        ce_weight: float = 1.0
        binary_kl_form: Literal["stable", "official"] = "stable"  # official: the official float32 clamp

        def __post_init__(self):
            check_config(self, positive=("temperature",), non_negative=("alpha", "ce_weight"))

    @property
    def divergence_hint(self) -> str | None:
        return official_form_hint(self.config.binary_kl_form, self.config.temperature, "a student logit")

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        bkl = cfg.alpha * binary_kl_loss(logits, self.teacher_logits(x), cfg.temperature, form=cfg.binary_kl_form)
        return {"loss": ce + bkl, "logits": logits, "ce": ce, "binary_kl": bkl}


def official_form_hint(form: str, temperature: float, what: str) -> str | None:
    """What the trainer says when the loss is not finite under ``binary_kl_form: official``."""
    if form != "official":
        return None
    return (f"method.binary_kl_form=official reproduces the official clamp of σ to [1e-8, 1 - 1e-8], whose upper "
            f"bound is 1.0 in float32: the loss is inf/NaN once {what} exceeds {24 * math.log(2) * temperature:.1f} "
            f"(24·ln 2·τ at τ = {temperature:g}); that is the official code's behaviour, not a bug here. "
            "Use method.binary_kl_form=stable to train past it")
