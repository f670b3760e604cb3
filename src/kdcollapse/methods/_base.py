"""The contract every training method follows (see docs/ARCHITECTURE.md, "Methods")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.models import Classifier


class FrozenTeacher:
    """A trained model used only for inference: eval mode, no gradients, never in an optimizer or DDP.

    Deliberately not an ``nn.Module``, so assigning it to a method registers nothing: the teacher is
    absent from ``parameters()``, ``state_dict()`` and DDP's buckets, and ``method.train()`` cannot
    switch it out of eval mode.
    """

    def __init__(self, model: Classifier):
        self.model = model.eval().requires_grad_(False)

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    def to(self, *args, **kwargs) -> FrozenTeacher:
        self.model.to(*args, **kwargs)
        return self

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features (B, d), logits (B, K)) in float32 whatever autocast is active.

        The forward runs in ``inference_mode`` (no autograd bookkeeping at all) in the caller's autocast
        precision and memory layout; the float32 copies made after it are ordinary tensors, which the
        student's losses may save for their backward pass (inference tensors may not be saved)."""
        with torch.inference_mode():
            h = self.model.forward_features(x)
            z = self.model.forward_head(h)
        return h.to(torch.float32, copy=True), z.to(torch.float32, copy=True)

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, K) logits, float32, without gradient."""
        return self(x)[1]


class Method(nn.Module):
    """A training method: owns the student (and any extra trainable parts) and its losses.

    ``forward(x, y)`` returns a dict with ``loss`` (the scalar to minimise), ``logits`` (main-head logits,
    used for the training accuracy) and any named parts to log (scalars).
    """

    @dataclass
    class Config:
        pass

    needs_teacher: ClassVar[bool] = False
    # Whether the method reads the teacher's penultimate features (not only its logits); such a method
    # cannot train from stored teacher logits (teacher.cache=logits).
    teacher_features: ClassVar[bool] = False
    # Independently augmented views per training image; with V > 1, forward gets x of shape (B, V, ...).
    views: ClassVar[int] = 1

    def __init__(
        self,
        student: Classifier,
        config,
        *,
        num_classes: int,
        teacher: FrozenTeacher | None = None,
        label_smoothing: float = 0.0,
    ):
        super().__init__()
        self.student = student
        self.config = config
        self.num_classes = num_classes
        self.teacher = teacher
        self.label_smoothing = label_smoothing
        self.epoch = 0
        # Training inputs are x = (u - input_mean) / input_std of images u in [0, 1], per channel.
        self.input_mean: tuple[float, ...] = (0.0,)
        self.input_std: tuple[float, ...] = (1.0,)

    def cross_entropy(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, target, label_smoothing=self.label_smoothing)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        raise NotImplementedError

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Main-head logits; every reported accuracy uses these."""
        return self.student(x)

    def inference_model(self) -> nn.Module:
        """The network saved as the run's model file (``model.safetensors``): the student, or e.g. an
        average of its weights kept by the method."""
        return self.student

    def set_input_normalization(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """The trainer's inputs are standardised, x = (u - mean) / std per channel, of images u in
        [0, 1]; methods that need u (adversarial training attacks it) read it from here."""
        self.input_mean, self.input_std = tuple(mean), tuple(std)

    def on_epoch_start(self, epoch: int) -> None:
        self.epoch = epoch

    def on_epoch_end(self, epoch: int) -> None:
        pass

    def epoch_metrics(self) -> dict[str, float]:
        """Method-specific numbers for this epoch's record in ``metrics.jsonl`` (called after on_epoch_end)."""
        return {}

    def after_step(self) -> None:
        """Called after every optimizer step (e.g. to remove a weight perturbation or update an average)."""

    def backward(self, out: dict[str, torch.Tensor], scale: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Fill ``.grad`` of the trainable parameters. ``scale`` is the AMP loss scaler (or identity)."""
        scale(out["loss"]).backward()

    def extra_state(self) -> dict[str, torch.Tensor]:
        """Tensors (not parameters or buffers) that a resumed run needs, e.g. accumulated class weights."""
        return {}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        pass
