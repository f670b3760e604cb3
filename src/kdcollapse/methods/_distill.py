"""What every distillation method shares: a frozen teacher with the student's label space, and the
linear warm-up ramp of the distillation term."""

from __future__ import annotations

import math

import torch
from torch import nn

from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.losses import get_loss, standardize_logits
from kdcollapse.methods._base import Method
from kdcollapse.methods._teacher import FrozenTeacher, TeacherRequest


class Distiller(Method):
    """A :class:`Method` that learns from a :class:`FrozenTeacher` over the same ``num_classes`` labels.

    The trainer already refuses a teacher trained on another dataset or label space
    (``runs/_load.py``); this check covers methods built directly with ``build_method``.
    """

    teacher_reads = TeacherRequest()  # the teacher's logits (a subclass asks for more, or names its τ)

    def __init__(self, student: nn.Module, config, *, num_classes: int, teacher: FrozenTeacher | None = None,
                 label_smoothing: float = 0.0, num_samples: int | None = None,
                 train_labels: torch.Tensor | None = None):
        super().__init__(student, config, num_classes=num_classes, teacher=teacher, label_smoothing=label_smoothing,
                         num_samples=num_samples, train_labels=train_labels)
        name = self.name
        if teacher is None:
            raise ConfigError(f"method '{name}' distils from a teacher; pass teacher=FrozenTeacher(model)")
        if teacher.num_classes != num_classes or self.student.num_classes != num_classes:
            raise KdcollapseError(
                f"method '{name}': teacher has {teacher.num_classes} classes, student has "
                f"{self.student.num_classes}, the data has {num_classes}; all three must share one label space"
            )

    def teacher_logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, K) teacher logits, float32, without gradient."""
        return self.read_teacher(x).logits


def standardized(config, *logits: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The logits z-scored per row (logit standardization, Sun et al. 2024) when
    ``config.logit_standardization`` is set, else as they are."""
    if not config.logit_standardization:
        return logits
    return tuple(standardize_logits(z) for z in logits)


def softmax_request(config) -> TeacherRequest:
    """What KD-like methods read: softmax(z_t / τ) at ``config.temperature`` (top-k teacher logits may be
    stored), or, with logit standardization, the whole logit row (its mean and standard deviation)."""
    if getattr(config, "logit_standardization", False):
        return TeacherRequest()
    return TeacherRequest(temperature=config.temperature)


def loss(name: str):
    """The registered loss function ``name`` (``kdcollapse.losses.get_loss(name).function``), for
    declaring a method's equality in the registry's words."""
    return get_loss(name).function


def at_least_float32(t: torch.Tensor) -> torch.Tensor:
    """``t`` in float32, or float64 when it is: the precision a loss runs in after autocast (a float64 check
    of the method's equality keeps its precision)."""
    return t if t.dtype == torch.float64 else t.float()


def warmup_factor(epoch: int, warmup_epochs: int) -> float:
    """min((epoch + 1) / warmup_epochs, 1) for the 0-based ``epoch``: the per-epoch ramp of the official
    DKD and IKL-KD code, whose epochs count from 1 (epoch 1 of 20 uses 1/20). ``warmup_epochs`` 0: no ramp."""
    if warmup_epochs <= 0:
        return 1.0
    return min((epoch + 1) / warmup_epochs, 1.0)


def check_config(config, *, positive: tuple[str, ...] = (), non_negative: tuple[str, ...] = ()) -> None:
    """Raise :class:`ConfigError` naming the first ``method.<field>`` outside its range (finite, and > 0 or
    >= 0: a temperature or weight of inf or nan means nothing)."""
    for names, ok, what in ((positive, lambda v: v > 0, "> 0"), (non_negative, lambda v: v >= 0, ">= 0")):
        for field in names:
            value = getattr(config, field)
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigError(f"method.{field} must be a finite number {what}, got {value}")
            if value is not None and not ok(value):
                raise ConfigError(f"method.{field} must be {what}, got {value}")
