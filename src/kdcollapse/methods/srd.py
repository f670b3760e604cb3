"""SRD (Miles & Mikolajczyk, "Understanding the role of the projector in knowledge distillation", AAAI 2024) as
torchdistill's official configuration trains it
(``yoshitomo-matsubara/torchdistill/configs/official/ilsvrc2012/roymiles/aaai2024/srd-resnet18_from_resnet34.yaml``
at 3e4373c, its
``SRDModelWrapper`` and ``SRDLoss``): both models' last-stage outputs, spatially averaged (the penultimate feature
here), go through ``BatchNorm1d(d_t, eps=1e-4, affine=False)``, the student's first through a linear projector
``Linear(d_s, d_t)``; loss = CE + 2·log Σ|p − q|⁴ + KL(softmax(z_t/τ) ‖ softmax(z_s/τ)) (batch mean, τ = 1).

torchdistill never puts the teacher (nor its wrapper's BatchNorm) in eval mode during training, so the teacher
side normalises with the batch's statistics: here the teacher request's ``batch_stats`` (its BatchNorms as in train
mode, running statistics untouched) and a batch-statistics BatchNorm of its feature.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import nn

from kdcollapse.losses import kd_loss, srd_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, at_least_float32, check_config, loss


def equals(m, x, y):
    """ce_weight·CE + feature_weight·srd(BN(P h_s), BN_batch(h_t)) + kd_weight·kd(τ)/τ², P the method's projector."""
    cfg = m.config
    h = m.student.forward_features(x)
    logits = m.student.forward_head(h)
    teacher = m.read_teacher(x)
    target = F.batch_norm(teacher.features, None, None, training=True, eps=cfg.eps)
    return (cfg.ce_weight * m.cross_entropy(logits, y)
            + cfg.feature_weight * loss("srd")(m.norm(m.projector(h)), target, cfg.exponent)
            + cfg.kd_weight * loss("kd")(logits, teacher.logits, cfg.temperature) / cfg.temperature**2)


@register_method("srd", equals=equals)
class SRD(Distiller):
    """ce_weight·CE(z_s, y) + feature_weight·log Σ|BN(P h_s) − BN(h_t)|^α + kd_weight·KL at τ (torchdistill's SRD).

    P: ``Linear(d_s, d_t)`` (the projector, trained with the student and kept out of the deployed model); BN:
    ``BatchNorm1d(d_t, eps=1e-4, affine=False)``, the student's in train mode, the teacher's on the batch's
    statistics. Logged parts: ``ce``, ``srd`` (the feature term) and ``kd``, weighted.
    """

    @dataclass
    class Config:
        ce_weight: float = 1.0  # WeightedSumLoss ce weight
        feature_weight: float = 2.0  # SRDLoss: 2 * feat_distill_loss
        kd_weight: float = 1.0  # SRDLoss: + kl_loss (weight 1 of the srd_loss term)
        exponent: float = 4.0  # SRDLoss exponent of the official config
        temperature: float = 1.0  # SRDLoss temperature of the official config
        eps: float = 1e-4  # norm_kwargs eps of both wrappers

        def __post_init__(self):
            check_config(self, positive=("exponent", "temperature", "eps"),
                         non_negative=("ce_weight", "feature_weight", "kd_weight"))

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(features=True, batch_stats=True)

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        teacher_dim = self.teacher.model.feature_dim
        self.projector = nn.Linear(self.student.feature_dim, teacher_dim)
        self.norm = nn.BatchNorm1d(teacher_dim, eps=config.eps, affine=False)

    def forward(self, x, y):
        cfg = self.config
        h = self.student.forward_features(x)
        logits = self.student.forward_head(h)
        teacher = self.read_teacher(x)
        target = F.batch_norm(teacher.features, None, None, training=True, eps=cfg.eps)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        feature = cfg.feature_weight * srd_loss(at_least_float32(self.norm(self.projector(h))), target, cfg.exponent)
        kd = cfg.kd_weight * kd_loss(logits, teacher.logits, cfg.temperature) / cfg.temperature**2
        return {"loss": ce + feature + kd, "logits": logits, "ce": ce, "srd": feature, "kd": kd}
