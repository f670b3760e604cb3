"""Probabilistic knowledge transfer (Passalis & Tefas, ECCV 2018) on penultimate features, with
mdistiller's CIFAR-100 weights (``CFG.PKT``: CE 1, PKT 30000)."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import pkt_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, at_least_float32, check_config, loss


def equals(m, x, y):
    """ce_weight·CE + pkt_weight·pkt(h_s, h_t) on the penultimate features."""
    cfg, h = m.config, m.student.forward_features(x)
    return (cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y)
            + cfg.pkt_weight * loss("pkt")(h, m.read_teacher(x).features))


@register_method("pkt", equals=equals)
class PKT(Distiller):
    """ce_weight·CE(z_s, y) + pkt_weight·PKT(h_s, h_t) (PKT eq. 12 with the cosine kernel).

    h_s = ``student.forward_features(x)`` and h_t the teacher's penultimate feature (mdistiller's
    ``pooled_feat``). PKT matches the batch's conditional-probability structure of cosine similarities,
    each computed in its own space, so the feature dimensions may differ and nothing is trained besides
    the student. Logged parts: ``ce`` and ``pkt``, weighted (they sum to ``loss``).
    """

    teacher_reads = TeacherRequest(features=True)

    @dataclass
    class Config:
        ce_weight: float = 1.0
        pkt_weight: float = 30000.0  # mdistiller CFG.PKT.LOSS.FEAT_WEIGHT

        def __post_init__(self):
            check_config(self, non_negative=("ce_weight", "pkt_weight"))

    def forward(self, x, y):
        cfg = self.config
        features = self.student.forward_features(x)
        logits = self.student.forward_head(features)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        pkt = cfg.pkt_weight * pkt_loss(at_least_float32(features), self.read_teacher(x).features)
        return {"loss": ce + pkt, "logits": logits, "ce": ce, "pkt": pkt}
