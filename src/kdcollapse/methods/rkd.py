"""Relational KD on penultimate features (Park et al., CVPR 2019), alone and on top of KD.

``rkd``: ce_weight·CE(y, p_s) + RKD(h_s, h_t), the RKD baseline of the intra-class KD paper's tables.
``kd_rkd``: the paper's "Ours+RKD": its student loss eq. 2, ce_weight·CE(y, p_s) + kd_weight·KD, plus
RKD. h_s = ``student.forward_features(x)`` and h_t the frozen teacher's feature. RKD compares the
B×B distance and B×B×B angle structures of the two batches of features, each computed inside its own
space, so student and teacher may have different feature dimensions and no projection is needed.
Logged parts are the weighted terms; they sum to ``loss``.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from kdcollapse.losses import kd_loss, rkd_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, at_least_float32, check_config, loss


def equals(m, x, y):
    """ce_weight·CE + rkd(h_s, h_t; distance_weight, angle_weight) on the penultimate features."""
    cfg, h = m.config, m.student.forward_features(x)
    return (cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y)
            + loss("rkd")(h, m.read_teacher(x).features, cfg.distance_weight, cfg.angle_weight))


def equals_kd_rkd(m, x, y):
    """The ``rkd`` equality plus kd_weight·kd(z_s, z_t, τ) (RKD paper eq. 2-3)."""
    cfg = m.config
    return equals(m, x, y) + cfg.kd_weight * loss("kd")(m.student(x), m.teacher_logits(x), cfg.temperature)


@register_method("rkd", equals=equals)
class RKD(Distiller):
    """ce_weight·CE + distance_weight·RKD-D + angle_weight·RKD-A on penultimate features."""

    teacher_reads = TeacherRequest(features=True)

    @dataclass
    class Config:
        ce_weight: float = 1.0
        distance_weight: float = 25.0  # Park et al.'s weights
        angle_weight: float = 50.0

        def __post_init__(self):
            check_config(self, non_negative=("ce_weight", "distance_weight", "angle_weight"))

    def forward(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        cfg = self.config
        features = self.student.forward_features(x)
        logits = self.student.forward_head(features)
        teacher = self.read_teacher(x)
        parts = {"ce": cfg.ce_weight * self.cross_entropy(logits, y),
                 "rkd": rkd_loss(at_least_float32(features), teacher.features, cfg.distance_weight, cfg.angle_weight)}
        parts |= self.logit_losses(logits, teacher.logits)
        return {"loss": sum(parts.values()), "logits": logits, **{k: v.detach() for k, v in parts.items()}}

    def logit_losses(self, logits: Tensor, teacher_logits: Tensor) -> dict[str, Tensor]:
        """Weighted losses between student and teacher logits added to CE + RKD (none for plain RKD)."""
        return {}


@register_method("kd_rkd", equals=equals_kd_rkd)
class KDRKD(RKD):
    """The intra-class KD paper's "Ours+RKD" student: 0.1·CE(y, p_s) + 0.9·CE(p_t, p_s) (eq. 2) + RKD.

    With temperature 1 the KD term τ²·KL(p_t ‖ p_s) differs from eq. 2's CE(p_t, p_s) by the teacher's
    entropy, a constant: the same gradients. Eq. 2-3 use no temperature, hence the default 1.
    """

    @dataclass
    class Config:
        ce_weight: float = 0.1  # α of eq. 2
        kd_weight: float = 0.9  # 1 − α, "the weight of the teacher's soft labels"
        temperature: float = 1.0
        distance_weight: float = 25.0
        angle_weight: float = 50.0

        def __post_init__(self):
            check_config(self, positive=("temperature",),
                         non_negative=("ce_weight", "kd_weight", "distance_weight", "angle_weight"))

    def logit_losses(self, logits: Tensor, teacher_logits: Tensor) -> dict[str, Tensor]:
        return {"kd": self.config.kd_weight * kd_loss(logits, teacher_logits, self.config.temperature)}
