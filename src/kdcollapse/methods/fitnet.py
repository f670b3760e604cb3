"""FitNets: hints for thin deep nets (Romero et al., ICLR 2015), as mdistiller trains it on CIFAR-100.

mdistiller (``mdistiller/distillers/FitNet.py``, ``CFG.FITNET``): the hint is the teacher's stage 2 output
(``HINT_LAYER = 2`` of its feature list: stem, stage 1, 2, 3), the guided layer the student's stage 2, the
regressor ``ConvReg`` (a convolution chosen from the two maps' sizes, then BatchNorm and ReLU), the loss
CE + 100·MSE, trained jointly from the first epoch (the paper's two-stage schedule — hint training first,
then KD — is not what mdistiller runs, and not what the papers' tables report).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from torch import nn

from kdcollapse.errors import ConfigError
from kdcollapse.losses import fitnet_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, at_least_float32, check_config, loss
from kdcollapse.methods._stages import check_stages


class ConvRegressor(nn.Module):
    """mdistiller's ``ConvReg``: student map (C_s, H_s, W_s) → teacher map (C_t, H_t, W_t), then BN, ReLU.

    A stride-2 3×3 convolution when H_s = 2·H_t, a stride-2 4×4 transposed convolution when 2·H_s = H_t,
    else a (1 + H_s − H_t)×(1 + W_s − W_t) convolution (1×1 for equal sizes)."""

    def __init__(self, s_channels: int, t_channels: int, s_size: tuple[int, int], t_size: tuple[int, int]):
        super().__init__()
        (s_h, s_w), (t_h, t_w) = s_size, t_size
        if s_h == 2 * t_h:
            self.conv: nn.Module = nn.Conv2d(s_channels, t_channels, 3, stride=2, padding=1)
        elif 2 * s_h == t_h:
            self.conv = nn.ConvTranspose2d(s_channels, t_channels, 4, stride=2, padding=1)
        elif s_h >= t_h:
            self.conv = nn.Conv2d(s_channels, t_channels, (1 + s_h - t_h, 1 + s_w - t_w))
        else:
            raise ConfigError(f"fitnet: no regressor from the student's {s_h}×{s_w} map to the teacher's "
                              f"{t_h}×{t_w} one (the official ConvReg has none); choose other stages")
        self.bn = nn.BatchNorm2d(t_channels)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(self.bn(self.conv(x)))


def equals(m, x, y):
    """ce_weight·CE + hint_weight·fitnet(r(v_s), u_t), r the method's regressor."""
    cfg = m.config
    h, (guided,) = m.student.forward_intermediates(x, [cfg.student_stage])
    (hint,) = m.read_teacher(x).maps
    return (cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y)
            + cfg.hint_weight * loss("fitnet")(m.regressor(guided), hint))


@register_method("fitnet", equals=equals)
class FitNet(Distiller):
    """ce_weight·CE(z_s, y) + hint_weight·mean (r(v_s) − u_t)² (FitNets eq. 3, mdistiller's reduction).

    v_s is the student's ``student_stage`` map, u_t the teacher's ``teacher_stage`` map, r the
    :class:`ConvRegressor`, sized from the two models' ``feature_info`` at ``input_size`` (mdistiller
    measures the maps at 32×32). The regressor belongs to the method: trained with the student, in the
    checkpoint, not in the deployed model. Logged parts: ``ce`` and ``hint``, weighted.
    """

    @dataclass
    class Config:
        ce_weight: float = 1.0  # mdistiller CFG.FITNET.LOSS.CE_WEIGHT
        hint_weight: float = 100.0  # mdistiller CFG.FITNET.LOSS.FEAT_WEIGHT
        student_stage: int = 2  # the guided layer (index into the student's feature_info)
        teacher_stage: int = 2  # the hint layer (mdistiller HINT_LAYER)
        input_size: int = 32  # input height = width at which the regressor's shapes are worked out

        def __post_init__(self):
            check_config(self, positive=("input_size",), non_negative=("ce_weight", "hint_weight"))

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(stages=(config.teacher_stage,))

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        (s,) = check_stages("student_stage", self.student.feature_info, [config.student_stage], "student")
        (t,) = check_stages("teacher_stage", self.teacher.feature_info, [config.teacher_stage], "teacher")
        size = config.input_size
        self.regressor = ConvRegressor(s.channels, t.channels, (math.ceil(size / s.reduction),) * 2,
                                       (math.ceil(size / t.reduction),) * 2)

    def forward(self, x, y):
        cfg = self.config
        h, (guided,) = self.student.forward_intermediates(x, [cfg.student_stage])
        logits = self.student.forward_head(h)
        (hint,) = self.read_teacher(x).maps
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        loss_hint = cfg.hint_weight * fitnet_loss(at_least_float32(self.regressor(guided)), hint)
        return {"loss": ce + loss_hint, "logits": logits, "ce": ce, "hint": loss_hint}
