"""Variational Information Distillation (Ahn et al., CVPR 2019) with mdistiller's defaults.

loss = ce_weight·CE + vid_weight·Σ_stages VID-NLL(regressor(s), t) (:func:`kdcollapse.losses.vid_loss`):
for each pair of ``student_stages`` / ``teacher_stages`` (mdistiller's ``feats[1:]``: the stages after the
stem, post-activation), the larger of the student's and the teacher's maps is average-pooled to the other's size, a regressor (1×1 conv,
ReLU, 1×1 conv, ReLU, 1×1 conv, no biases, teacher width) predicts the teacher's map from the student's, and
a per-channel variance softplus(α) + 1e-5, initialised to ``init_variance``, is learned with it.

mdistiller keeps the α of each stage in a plain Python list, so its optimizer never updates them and the
variance stays at its initial value; the VID paper learns them. ``learn_variance`` (default true) follows
the paper; false reproduces mdistiller. Regressors and α belong to the method (optimizer, checkpoint), not
to the model file. Logged parts: ``ce`` and ``vid`` (weighted).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from kdcollapse.losses import match_spatial_size, vid_initial_log_scale, vid_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, check_config, loss
from kdcollapse.methods._stages import check_pairs, check_stages, stages


def regressor(c_in: int, c_out: int) -> nn.Sequential:
    """The official VID regressor: three 1×1 convolutions without bias, ReLU between them."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 1, bias=False), nn.ReLU(), nn.Conv2d(c_out, c_out, 1, bias=False),
                         nn.ReLU(), nn.Conv2d(c_out, c_out, 1, bias=False))


def equals(m, x, y):
    """ce_weight·CE + vid_weight·Σ_stages vid(r(v_s), u_t, α), r the regressors and α the log-scales."""
    cfg = m.config
    h, maps = m.student.forward_intermediates(x, list(cfg.student_stages))
    nll = 0.0
    for f_s, f_t, reg, alpha in zip(maps, m.read_teacher(x).maps, m.regressors, m.log_scales):
        f_s, f_t = match_spatial_size(f_s, f_t)
        nll = nll + loss("vid")(reg(f_s), f_t, alpha)
    return cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y) + cfg.vid_weight * nll


@register_method("vid", equals=equals, checks=({"learn_variance": False},))
class VID(Distiller):
    """CE + VID's Gaussian negative log-likelihood of the teacher's stage maps given the student's."""

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(stages=tuple(config.teacher_stages))

    @dataclass
    class Config:
        ce_weight: float = 1.0
        vid_weight: float = 1.0  # mdistiller VID.LOSS.FEAT_WEIGHT
        init_variance: float = 5.0  # VID.INIT_PRED_VAR
        learn_variance: bool = True  # the paper; false: mdistiller's fixed variance (see the module docstring)
        student_stages: list[int] = stages(1, 2, 3)  # feature_info indices (mdistiller's feats[1:])
        teacher_stages: list[int] = stages(1, 2, 3)  # the teacher's, paired in order

        def __post_init__(self):
            check_config(self, positive=("init_variance",), non_negative=("ce_weight", "vid_weight"))

    def __init__(self, student, config, *, num_classes, **kwargs):
        super().__init__(student, config, num_classes=num_classes, **kwargs)
        s_info = check_stages("student_stages", self.student.feature_info, config.student_stages, "student")
        t_info = check_stages("teacher_stages", self.teacher.feature_info, config.teacher_stages, "teacher")
        check_pairs("student_stages", "teacher_stages", config.student_stages, config.teacher_stages)
        s_channels, t_channels = [f.channels for f in s_info], [f.channels for f in t_info]
        self.regressors = nn.ModuleList(regressor(s, t) for s, t in zip(s_channels, t_channels))
        alpha = vid_initial_log_scale(config.init_variance)
        self.log_scales = nn.ParameterList(
            nn.Parameter(torch.full((t,), alpha), requires_grad=config.learn_variance) for t in t_channels)

    def forward(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        cfg = self.config
        features, maps = self.student.forward_intermediates(x, list(cfg.student_stages))
        logits = self.student.forward_head(features)
        targets = self.read_teacher(x).maps
        nll = 0.0
        for f_s, f_t, reg, alpha in zip(maps, targets, self.regressors, self.log_scales):
            f_s, f_t = match_spatial_size(f_s, f_t)
            nll = nll + vid_loss(reg(f_s), f_t, alpha)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        vid = cfg.vid_weight * nll
        return {"loss": ce + vid, "logits": logits, "ce": ce.detach(), "vid": vid.detach()}
