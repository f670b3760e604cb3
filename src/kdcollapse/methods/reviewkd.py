"""ReviewKD: knowledge review with attention-based fusion (Chen, Liu, Zhao & Jia, CVPR 2021).

The student's stage maps, deepest first, pass through a chain of attention-based fusion (ABF) blocks:
each block maps its stage to ``mid`` channels with a 1×1 conv, fuses it with the (upsampled) output of
the deeper block through two spatial attention maps, and maps the result to the teacher's channels with
a 3×3 conv. The fused maps are compared with the teacher's maps of the same stages by the hierarchical
context loss (:func:`kdcollapse.losses.hcl_loss`). The ABF blocks belong to this method: trained with the
student, saved in the checkpoint, absent from the model file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kdcollapse.losses import hcl_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, check_config, loss, warmup_factor
from kdcollapse.methods._stages import check_pairs, check_stages, stages


class ABF(nn.Module):
    """One attention-based fusion block (the paper's Fig. 3; official ``ABF``).

    ``forward(x, residual, shape, out_shape)`` → (output, fused): x (B, C_in, H, W) goes through
    1×1 conv + BN to ``mid`` channels; with ``fuse``, the deeper block's ``residual`` (B, mid, h, w) is
    resized to ``shape``×``shape`` (nearest) and the two are mixed by the two channels of
    sigmoid(1×1 conv([x, residual])); the mix is resized to ``out_shape`` if needed and goes through 3×3
    conv + BN to ``out_channels``. ``fused`` is the residual handed to the next (shallower) block.
    ``shape`` and ``out_shape`` may be (H, W) pairs: the official code's square sizes, generalised to
    non-square maps (``fashion_mnist_pairs``' 28×56 images); a square size gives the official result.
    """

    def __init__(self, in_channels: int, mid_channels: int, out_channels: int, fuse: bool):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(in_channels, mid_channels, 1, bias=False),
                                   nn.BatchNorm2d(mid_channels))
        self.conv2 = nn.Sequential(nn.Conv2d(mid_channels, out_channels, 3, padding=1, bias=False),
                                   nn.BatchNorm2d(out_channels))
        self.att_conv = (nn.Sequential(nn.Conv2d(2 * mid_channels, 2, 1), nn.Sigmoid()) if fuse else None)
        nn.init.kaiming_uniform_(self.conv1[0].weight, a=1)  # the official initialisation
        nn.init.kaiming_uniform_(self.conv2[0].weight, a=1)

    def forward(self, x: Tensor, residual: Tensor | None = None, shape: int | None = None,
                out_shape: int | None = None) -> tuple[Tensor, Tensor]:
        x = self.conv1(x)
        if self.att_conv is not None:
            residual = F.interpolate(residual, _pair(shape), mode="nearest")
            attention = self.att_conv(torch.cat([x, residual], dim=1))
            x = x * attention[:, :1] + residual * attention[:, 1:]
        if out_shape is not None and tuple(x.shape[-2:]) != _pair(out_shape):
            x = F.interpolate(x, _pair(out_shape), mode="nearest")
        return self.conv2(x), x


def _pair(size: int | Sequence[int]) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


class ReviewFusion(nn.Module):
    """The chain of ABF blocks over the student's stages (official ``ReviewKD.abfs`` and its forward).

    ``in_channels`` (student) and ``out_channels`` (teacher) list the stages shallow to deep, the last
    entry being the pooled feature as a 1×1 map. ``mid_channels`` is min(512, in_channels[-1]) officially
    (mdistiller reads a ``MAX_MID_CHANNEL`` setting but does not use it). ``forward(maps, out_sizes)``
    takes the student's maps and the teacher maps' sizes, shallow to deep, and returns the fused maps
    shallow to deep, each with its teacher stage's channels and size. The official ``SHAPES`` list (the
    student maps' sizes, deepest first) is read off the maps here; its ``OUT_SHAPES`` are ``out_sizes``.
    """

    def __init__(self, in_channels: Sequence[int], out_channels: Sequence[int], mid_channels: int | None = None):
        super().__init__()
        mid = min(512, in_channels[-1]) if mid_channels is None else mid_channels
        last = len(in_channels) - 1
        blocks = [ABF(c_in, mid, c_out, i < last) for i, (c_in, c_out) in enumerate(zip(in_channels, out_channels))]
        self.blocks = nn.ModuleList(blocks[::-1])  # deepest first, the order they run in

    def forward(self, maps: Sequence[Tensor], out_sizes: Sequence[int]) -> list[Tensor]:
        maps, out_sizes = list(maps)[::-1], list(out_sizes)[::-1]
        out, residual = self.blocks[0](maps[0], out_shape=out_sizes[0])
        results = [out]
        for x, block, out_size in zip(maps[1:], self.blocks[1:], out_sizes[1:]):
            out, residual = block(x, residual, tuple(x.shape[-2:]), out_size)
            results.insert(0, out)
        return results


def equals(m, x, y):
    """ce_weight·CE + reviewkd_weight·warm-up·Σ hcl(ABF-fused student maps, teacher pre-ReLU maps and feature)."""
    cfg = m.config
    h, maps = m.student.forward_intermediates(x, list(cfg.student_stages), pre_act=cfg.student_pre_act)
    teacher = m.read_teacher(x)
    targets = [*teacher.maps, teacher.features[:, :, None, None]]
    fused = m.fusion([*maps, h[:, :, None, None]], [tuple(t.shape[-2:]) for t in targets])
    hcl = sum(loss("hcl")(f, t) for f, t in zip(fused, targets))
    return (cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y)
            + cfg.reviewkd_weight * warmup_factor(m.epoch, cfg.warmup_epochs) * hcl)


@register_method("reviewkd", equals=equals)
class ReviewKD(Distiller):
    """ce_weight·CE + reviewkd_weight·min(epoch / warmup_epochs, 1)·HCL(ABF(student maps), teacher maps).

    The student's maps of ``student_stages`` (post-activation, or pre-activation with ``student_pre_act`` as
    mdistiller's ImageNet configs) and its pooled feature as a 1×1 map go through :class:`ReviewFusion`;
    the targets are the teacher's pre-activation maps of ``teacher_stages`` and its pooled feature
    (mdistiller's ``preact_feats[1:]`` and ``pooled_feat``). Both default to the three stages after
    the stem of the CIFAR ResNets (mdistiller's ``feats[1:]``); the recipes list them for other families.
    The warm-up counts epochs from 1 as mdistiller does (epoch 1 of 20 weighted 1/20).
    Logged parts: ``ce`` and ``reviewkd`` (weighted and ramped).
    """

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(features=True, stages=tuple(config.teacher_stages), pre_act=True)

    @dataclass
    class Config:
        ce_weight: float = 1.0
        reviewkd_weight: float = 1.0  # mdistiller REVIEWKD_WEIGHT (5 for resnet32x4 -> resnet8x4)
        warmup_epochs: int = 20  # linear ramp of the ReviewKD term; 0: none
        student_stages: list[int] = stages(1, 2, 3)  # feature_info indices, shallow to deep
        teacher_stages: list[int] = stages(1, 2, 3)  # the teacher's, paired in order
        student_pre_act: bool = False  # mdistiller STU_PREACT (True in its ImageNet configs)
        mid_channels: int = 0  # ABF width; 0: min(512, student feature width), the official rule

        def __post_init__(self):
            check_config(self, non_negative=("ce_weight", "reviewkd_weight", "warmup_epochs", "mid_channels"))

    def __init__(self, student, config, *, num_classes, **kwargs):
        super().__init__(student, config, num_classes=num_classes, **kwargs)
        s_info = check_stages("student_stages", self.student.feature_info, config.student_stages, "student")
        t_info = check_stages("teacher_stages", self.teacher.feature_info, config.teacher_stages, "teacher")
        check_pairs("student_stages", "teacher_stages", config.student_stages, config.teacher_stages)
        self.fusion = ReviewFusion([*(f.channels for f in s_info), self.student.feature_dim],
                                   [*(f.channels for f in t_info), self.teacher.model.feature_dim],
                                   config.mid_channels or None)

    def forward(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        cfg = self.config
        features, maps = self.student.forward_intermediates(x, list(cfg.student_stages), pre_act=cfg.student_pre_act)
        logits = self.student.forward_head(features)
        teacher = self.read_teacher(x)
        targets = [*teacher.maps, teacher.features[:, :, None, None]]
        fused = self.fusion([*maps, features[:, :, None, None]], [tuple(t.shape[-2:]) for t in targets])
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        hcl = sum(hcl_loss(f, t) for f, t in zip(fused, targets))
        review = cfg.reviewkd_weight * warmup_factor(self.epoch, cfg.warmup_epochs) * hcl
        return {"loss": ce + review, "logits": logits, "ce": ce.detach(), "reviewkd": review.detach()}
