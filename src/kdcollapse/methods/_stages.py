"""What the feature-map methods (FitNet, AT, OFD, NST, SP) share: their stage options, checked against
the models' ``feature_info`` when the method is built, and :class:`StageTransfer`, the methods that compare
stage maps without trainable parts (AT, NST, SP)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import field

from kdcollapse.errors import ConfigError
from kdcollapse.methods._distill import Distiller, at_least_float32, check_config
from kdcollapse.methods._teacher import TeacherRequest
from kdcollapse.models import FeatureInfo


def check_stages(key: str, feature_info: Sequence[FeatureInfo], stages: Sequence[int], whose: str) -> list[FeatureInfo]:
    """The ``feature_info`` entries of ``stages`` (``method.<key>``; negative counts from the end), or a
    :class:`ConfigError` naming the key, the model's stages and their channels."""
    n = len(feature_info)
    bad = [i for i in stages if not -n <= i < n]
    if not stages or bad:
        offered = ", ".join(f"{f.stage} ({f.channels} ch, /{f.reduction})" for f in feature_info) or "none"
        raise ConfigError(f"method.{key}: stage(s) {bad or list(stages)} not offered by the {whose}; its stages "
                          f"are {offered}")
    return [feature_info[i] for i in stages]


def check_pairs(student_key: str, teacher_key: str, student: Sequence[int], teacher: Sequence[int]) -> None:
    """A :class:`ConfigError` unless the student's and the teacher's stage lists pair one to one."""
    if len(student) != len(teacher):
        raise ConfigError(f"method.{student_key} {list(student)} and method.{teacher_key} {list(teacher)} must "
                          f"pair the stages one to one (equal lengths)")


class StageTransfer(Distiller):
    """ce_weight·CE(z_s, y) + feat_weight·loss(student maps, teacher maps), nothing trained besides the
    student, so the maps may differ in channels. The loss is ``loss_fn`` and its logged name ``part``; a
    subclass sets both and its ``Config`` (with ``student_stages``, ``teacher_stages``, paired in order,
    ``ce_weight``, ``feat_weight``)."""

    part = ""

    @staticmethod
    def loss_fn(student_maps, teacher_maps, config):
        raise NotImplementedError

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(stages=tuple(config.teacher_stages))

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        check_stages("student_stages", self.student.feature_info, config.student_stages, "student")
        check_stages("teacher_stages", self.teacher.feature_info, config.teacher_stages, "teacher")
        check_pairs("student_stages", "teacher_stages", config.student_stages, config.teacher_stages)

    def forward(self, x, y):
        cfg = self.config
        h, maps = self.student.forward_intermediates(x, list(cfg.student_stages))
        logits = self.student.forward_head(h)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        feat = cfg.feat_weight * self.loss_fn([at_least_float32(m) for m in maps], self.read_teacher(x).maps, cfg)
        return {"loss": ce + feat, "logits": logits, "ce": ce, self.part: feat}


def stage_maps(method, x):
    """(student logits, the student's maps of ``student_stages``, the teacher's of ``teacher_stages``): what
    a :class:`StageTransfer` equality reads."""
    h, maps = method.student.forward_intermediates(x, list(method.config.student_stages))
    return method.student.forward_head(h), maps, method.read_teacher(x).maps


def stages(*default: int):
    """A ``list[int]`` config field of stage indices with this default."""
    return field(default_factory=lambda: list(default))


def check_weights(config) -> None:
    """``ce_weight`` and ``feat_weight`` are >= 0."""
    check_config(config, non_negative=("ce_weight", "feat_weight"))
