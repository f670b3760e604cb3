"""Dual-Head Knowledge Distillation (Yang et al., DHKD paper §3.3)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kdcollapse.losses import binary_kl_loss, binary_kl_norm_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import check_config, loss
from kdcollapse.methods._dual_head import DualHead, DualHeadConfig
from kdcollapse.methods.ce_binarykl import official_form_hint


def equals(m, x, y):
    """ce_weight·CE(g(f)) + alpha·aux_loss(g′(f), z_t, τ, form) (binary_kl_norm or binary_kl) while distilling."""
    cfg, h = m.config, m.student.forward_features(x)
    ce = cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y)
    if not m.distilling():
        return ce
    return ce + cfg.alpha * loss(cfg.aux_loss)(m.aux_head(h), m.teacher_logits(x), cfg.temperature,
                                              form=cfg.binary_kl_form)


@register_method("dhkd", equals=equals, checks=({"aux_loss": "binary_kl", "aux_head": "mlp"},
                                                {"binary_kl_form": "official"}, {"distill_until": 1}))
class DHKD(DualHead):
    """ce_weight·CE(g(f(x)), y) + alpha·BinaryKL-Norm(g′(f(x)), z_t, τ) (DHKD eq. 5 on the auxiliary head).

    CE trains g and f, BinaryKL-Norm trains g′ and f; ``alignment`` projects the distillation gradient
    when it opposes the CE gradient (see :class:`~kdcollapse.methods._dual_head.DualHead`).
    Official recipes: CIFAR-100 τ = 2, alpha ∈ {0.5, 1, 2} (0.1 for res56→res20 and res110→res32),
    alignment on, ``aux_head: mlp`` across architectures; ImageNet alpha 0.1, linear head, no
    alignment, ``distill_until: 50`` of 100 epochs. ``binary_kl_form: official`` uses the official
    clamped BinaryKL-Norm (inf in float32 once z_s − z_t exceeds ≈ 16.6·τ). ``aux_loss: binary_kl`` puts
    the plain BinaryKL (eq. 1) on g′ instead, the comparison of the paper's Tables 8–9. Logged parts:
    ``ce``, and ``binary_kl_norm`` (or ``binary_kl``), weighted.
    """

    distill_name = "binary_kl_norm"

    @dataclass
    class Config(DualHeadConfig):
        alpha: float = 1.0  # BinaryKL-Norm weight
        temperature: float = 2.0  # τ
        binary_kl_form: Literal["stable", "official"] = "stable"  # official: the official float32 clamp
        aux_loss: Literal["binary_kl_norm", "binary_kl"] = "binary_kl_norm"  # binary_kl: Tables 8-9's BinaryKL

        def __post_init__(self):
            super().__post_init__()
            check_config(self, positive=("temperature",), non_negative=("alpha",))

    def __init__(self, student, config, *, num_classes, **kwargs):
        super().__init__(student, config, num_classes=num_classes, **kwargs)
        self.distill_name = config.aux_loss  # the logged part names the loss on g′

    @property
    def divergence_hint(self) -> str | None:
        cfg = self.config
        what = "an auxiliary-head logit" + (" minus the teacher's" if cfg.aux_loss == "binary_kl_norm" else "")
        return official_form_hint(cfg.binary_kl_form, cfg.temperature, what)

    def distill_loss(self, aux_logits, teacher_logits, y):
        cfg = self.config
        loss = binary_kl_norm_loss if cfg.aux_loss == "binary_kl_norm" else binary_kl_loss
        return cfg.alpha * loss(aux_logits, teacher_logits, cfg.temperature, form=cfg.binary_kl_form)
