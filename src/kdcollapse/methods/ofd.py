"""A comprehensive overhaul of feature distillation (OFD, Heo et al., ICCV 2019), as mdistiller runs it.

mdistiller (``mdistiller/distillers/OFD.py``, ``CFG.OFD``): the pre-ReLU maps of every stage after the stem
(``preact_feats[1:]``), a connector per stage (1×1 convolution without bias + BatchNorm, weights drawn
from N(0, 2/(k²·C_t))), the teacher's maps through the margin ReLU with per-channel margins from the
BatchNorm before each stage's ReLU, the partial L2 distance, stage i of n weighted 2^−(n−1−i), CE 1 and
OFD 1e-3 on CIFAR-100 (1e-4 on ImageNet).

The teacher, as in mdistiller, normalises with the batch's statistics (``teacher_bn: batch``): mdistiller's
``OFD.train`` leaves out the ``teacher.eval()`` of ``Distiller.train``, so its teacher trains in train mode
and every BatchNorm before a ReLU (and the WRN BatchNorms that give its ``preact_feats``) uses the batch's
mean and variance. Its running statistics then keep moving, but nothing in OFD reads them (the margins come
from the BatchNorm weights and biases); here they stay as loaded, so a resumed run and a later use of the
teacher see the same teacher. ``teacher_bn: running`` uses the running statistics (eval mode) instead.

Deliberate difference: for a pre-activation network (WRN) the teacher's stage output passes through the
BatchNorm that follows it, which also gives the margin (mdistiller's WRN ``preact_feats``), while a WRN
student's map is taken as the stage outputs it (mdistiller applies the student's next BatchNorm there too;
the connector ends with its own).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass

import torch
from torch import nn

from kdcollapse.errors import ConfigError
from kdcollapse.losses import ofd_loss, ofd_margin
from kdcollapse.methods import TeacherRequest, batch_statistics, register_method
from kdcollapse.methods._distill import Distiller, at_least_float32, check_config, loss
from kdcollapse.methods._stages import check_pairs, check_stages, check_weights, stages
from kdcollapse.models import FeatureInfo


def connector(s_channels: int, t_channels: int, kernel_size: int) -> nn.Sequential:
    """mdistiller's ``ConnectorConvBN`` for one stage: conv (no bias) + BN, He-normal over k²·C_t."""
    conv = nn.Conv2d(s_channels, t_channels, kernel_size, padding=(kernel_size - 1) // 2, bias=False)
    nn.init.normal_(conv.weight, 0.0, math.sqrt(2.0 / (kernel_size * kernel_size * t_channels)))
    bn = nn.BatchNorm2d(t_channels)  # weight 1, bias 0 at construction
    return nn.Sequential(conv, bn)


def _first_leaf(module: nn.Module | None) -> nn.Module | None:
    for m in () if module is None else module.modules():
        if not list(m.children()):
            return m
    return None


def bn_before_relu(model: nn.Module, info: FeatureInfo) -> tuple[nn.BatchNorm2d, bool]:
    """The BatchNorm whose output reaches the ReLU that ends stage ``info``, and whether it comes *after*
    the stage output (a pre-activation network: the next layer starts with it, as in a WRN) and must be
    applied to the map. Otherwise it is the stage's last BatchNorm (a residual block's branch: the sum
    adds the shortcut, as mdistiller's ``get_bn_before_relu`` takes ``bn2``/``bn3``)."""
    parent_path, _, index = info.module.rpartition(".")
    if parent_path and index.isdigit():
        parent = model.get_submodule(parent_path)
        following = parent[int(index) + 1] if int(index) + 1 < len(parent) else None
        first = _first_leaf(following)
        if isinstance(first, nn.BatchNorm2d):
            return first, True
    stage = model.get_submodule(info.module)
    norms = [m for m in getattr(stage, "branch", stage).modules() if isinstance(m, nn.BatchNorm2d)]
    if not norms:
        raise ConfigError(f"ofd: the teacher's stage {info.stage} ({info.module}) has no BatchNorm before its "
                          f"ReLU, so OFD's margin cannot be computed; choose other method.teacher_stages")
    return norms[-1], False


TEACHER_BN = ("batch", "running")


def equals(m, x, y):
    """ce_weight·CE + feat_weight·ofd(C(pre-ReLU student maps), teacher pre-ReLU maps after its BN, margins)."""
    cfg = m.config
    h, maps = m.student.forward_intermediates(x, list(cfg.student_stages), pre_act=True)
    targets = [t if bn is None else m.teacher_norm(bn, t) for bn, t in zip(m._teacher_norms, m.read_teacher(x).maps)]
    connected = [c(s) for c, s in zip(m.connectors, maps)]
    return (cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y)
            + cfg.feat_weight * loss("ofd")(connected, targets, m.margins()))


@register_method("ofd", equals=equals, checks=({"teacher_bn": "running"},))
class OFD(Distiller):
    """ce_weight·CE(z_s, y) + feat_weight·Σ_i 2^−(n−1−i)·d_p(σ_m(T_i), C_i(S_i)) (OFD eqs. 2-5;
    :func:`kdcollapse.losses.ofd_loss`), on pre-ReLU maps. The connectors C_i belong to the method (trained,
    checkpointed, never in the deployed model); the margins are buffers computed once from the teacher.
    Logged parts: ``ce`` and ``ofd``, weighted.
    """

    @dataclass
    class Config:
        ce_weight: float = 1.0  # mdistiller CFG.OFD.LOSS.CE_WEIGHT
        feat_weight: float = 1e-3  # CFG.OFD.LOSS.FEAT_WEIGHT (1e-4 in the ImageNet config)
        connector_kernel: int = 1  # CFG.OFD.CONNECTOR.KERNEL_SIZE
        student_stages: list[int] = stages(1, 2, 3)  # preact_feats[1:] of the CIFAR ResNets and WRNs
        teacher_stages: list[int] = stages(1, 2, 3)
        teacher_bn: str = "batch"  # the teacher's BatchNorm statistics: the batch's (mdistiller) or running

        def __post_init__(self):
            check_config(self, positive=("connector_kernel",))
            check_weights(self)
            if self.teacher_bn not in TEACHER_BN:
                raise ConfigError(f"method.teacher_bn must be one of {', '.join(TEACHER_BN)}, got {self.teacher_bn!r}")

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(stages=tuple(config.teacher_stages), pre_act=True,
                              batch_stats=config.teacher_bn == "batch")

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        s_info = check_stages("student_stages", self.student.feature_info, config.student_stages, "student")
        t_info = check_stages("teacher_stages", self.teacher.feature_info, config.teacher_stages, "teacher")
        check_pairs("student_stages", "teacher_stages", config.student_stages, config.teacher_stages)
        self.connectors = nn.ModuleList(connector(s.channels, t.channels, config.connector_kernel)
                                        for s, t in zip(s_info, t_info))
        norms = [bn_before_relu(self.teacher.model, t) for t in t_info]
        self._teacher_norms = [bn if after else None for bn, after in norms]  # the teacher's: not registered
        for i, (bn, _) in enumerate(norms):
            self.register_buffer(f"margin_{i}", ofd_margin(bn.weight, bn.bias).float())

    def margins(self) -> list[torch.Tensor]:
        return [getattr(self, f"margin_{i}") for i in range(len(self.connectors))]

    def forward(self, x, y):
        cfg = self.config
        h, maps = self.student.forward_intermediates(x, list(cfg.student_stages), pre_act=True)
        logits = self.student.forward_head(h)
        connected = [at_least_float32(c(m)) for c, m in zip(self.connectors, maps)]
        with torch.no_grad():
            targets = [m if bn is None else self.teacher_norm(bn, m)
                       for bn, m in zip(self._teacher_norms, self.read_teacher(x).maps)]
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        ofd = cfg.feat_weight * ofd_loss(connected, targets, self.margins())
        return {"loss": ce + ofd, "logits": logits, "ce": ce, "ofd": ofd}

    def teacher_norm(self, bn: nn.BatchNorm2d, m: torch.Tensor) -> torch.Tensor:
        """The teacher's BatchNorm ``bn`` after a pre-activation stage, with the statistics of ``teacher_bn``."""
        with batch_statistics(bn) if self.request.batch_stats else contextlib.nullcontext():
            return bn(m)
