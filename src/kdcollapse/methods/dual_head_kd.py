"""Dual head with vanilla KD on the auxiliary head (the DHKD paper's App. K baseline)."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import kd_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._distill import check_config, loss
from kdcollapse.methods._dual_head import DualHead, DualHeadConfig


def equals(m, x, y):
    """ce_weight·CE(g(f)) + kd_weight·kd(g′(f), z_t, τ) while distilling."""
    cfg, h = m.config, m.student.forward_features(x)
    ce = cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y)
    if not m.distilling():
        return ce
    return ce + cfg.kd_weight * loss("kd")(m.aux_head(h), m.teacher_logits(x), cfg.temperature)


@register_method("dual_head_kd", equals=equals, checks=({"distill_until": 1},))
class DualHeadKD(DualHead):
    """ce_weight·CE(g(f(x)), y) + kd_weight·τ²·KL(softmax(z_t/τ) ‖ softmax(g′(f(x))/τ)) (DHKD Table 12).

    Same two heads as ``dhkd`` with the probability-level KD loss on g′ instead of BinaryKL-Norm; the
    paper finds it only slightly better than KD, so the gain of DHKD is not the extra head alone.
    The paper gives no weights for it; the defaults are CE 1, KD 1, τ 4. Logged parts: ``ce``, ``kd``.
    """

    distill_name = "kd"

    @dataclass
    class Config(DualHeadConfig):
        kd_weight: float = 1.0
        temperature: float = 4.0  # τ

        def __post_init__(self):
            super().__post_init__()
            check_config(self, positive=("temperature",), non_negative=("kd_weight",))

    def distill_loss(self, aux_logits, teacher_logits, y):
        return self.config.kd_weight * kd_loss(aux_logits, teacher_logits, self.config.temperature)
