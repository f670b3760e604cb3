"""What the feature-map methods (FitNet, AT, OFD, NST, SP) share: their stage options, checked against
the models' ``feature_info`` when the method is built."""

from __future__ import annotations

from collections.abc import Sequence

from kdcollapse.errors import ConfigError
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
    if len(student) != len(teacher):
        raise ConfigError(f"method.{student_key} {list(student)} and method.{teacher_key} {list(teacher)} must "
                          f"pair the stages one to one (equal lengths)")
