"""The contract every training method follows (see docs/ARCHITECTURE.md, "Methods")."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol

import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.errors import KdcollapseError
from kdcollapse.methods._teacher import FrozenTeacher, TeacherOutput, TeacherRequest
from kdcollapse.models import Classifier, as_classifier


def check_train_labels(labels: torch.Tensor | None, num_samples: int | None,
                       num_classes: int) -> tuple[torch.Tensor | None, int | None]:
    """(labels as a CPU int64 vector, N) from the constructor's ``train_labels`` and ``num_samples``, which
    must agree when both are given; a :class:`KdcollapseError` names a label outside [0, num_classes)."""
    if labels is None:
        return None, num_samples
    labels = torch.as_tensor(labels).detach().to("cpu", torch.int64).flatten()
    if num_samples is not None and num_samples != len(labels):
        raise KdcollapseError(f"train_labels has {len(labels)} entries but num_samples={num_samples}; "
                              "give the labels of the whole training set")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise KdcollapseError(f"train_labels must lie in [0, {num_classes}), got range "
                              f"[{int(labels.min())}, {int(labels.max())}]")
    return labels, len(labels)


class Equality(Protocol):
    """What a method's training loss must equal: ``equals(method, x, y, **batch) -> loss`` (0-dim), from
    registered losses and the method's own connectors (see :func:`kdcollapse.methods.register_method`)."""

    def __call__(self, method: Method, x: torch.Tensor, y: torch.Tensor, **batch: torch.Tensor) -> torch.Tensor: ...


class Method(nn.Module):
    """A training method: owns the student (and any extra trainable parts) and its losses.

    The trainer (``kdcollapse.train``) uses a method only through the attributes and hooks declared
    here, in this order per run: ``teacher_request(config)``, ``views`` and ``needs_index`` (read before
    construction), ``optimizer_groups``, ``set_input_normalization``, then per epoch ``on_epoch_start`` → for every step
    ``forward`` → ``backward`` → optimizer step → ``after_step`` → ``on_epoch_end`` → ``epoch_metrics``;
    ``predict`` for evaluation, ``student`` for the per-epoch collapse metrics, ``inference_model`` for the
    saved model file, ``extra_state`` / ``load_extra_state`` for checkpoints. A subclass overrides the
    hooks it needs; the defaults are those of plain cross-entropy training.
    The student is a :class:`Classifier` or any module :func:`~kdcollapse.models.as_classifier` can wrap
    with its default feature spec (wrap it yourself to choose another).
    """

    @dataclass
    class Config:
        """The method's ``method:`` section of the run config (typed fields, unknown keys rejected); a
        subclass declares its own dataclass. ``load_config`` adds ``name``, the registered name."""

    name: ClassVar[str] = ""
    """The registered name (``method.name``); set by :func:`kdcollapse.methods.register_method`."""

    equals: ClassVar[Equality | None] = None
    """What ``forward(x, y)["loss"]`` must equal, in value and gradient: the combination of registered losses
    the method claims to compute, declared with ``register_method(name, equals=...)`` (``None``: not
    declared, which the contract test refuses). Read only by the contract test, never by the trainer."""

    equality_checks: ClassVar[tuple[dict[str, Any], ...]] = ({},)
    """The config overrides under which the contract test checks :attr:`equals` (``{}``: the defaults), set
    by ``register_method(name, checks=...)``."""

    @classmethod
    def teacher_request(cls, config) -> TeacherRequest | None:
        """What the method reads from its teacher, in one value (``None``: it has no teacher), read before
        construction: the trainer loads ``teacher:`` only when it is not ``None`` (and refuses one
        otherwise), serves a logits-only request from stored logits when ``teacher.cache=logits``, and
        stores top-k logits only when the request names the temperature it reads them at. The method reads
        its teacher with ``self.read_teacher(x)`` (a :class:`TeacherOutput`). By default
        :attr:`teacher_reads`; a method whose request depends on its config overrides this."""
        return cls.teacher_reads

    teacher_reads: ClassVar[TeacherRequest | None] = None
    """The teacher request of a method whose request does not depend on its config, declared as a value
    (e.g. ``TeacherRequest(features=True)``); what the default :meth:`teacher_request` returns."""

    needs_index: ClassVar[bool] = False
    """Whether ``forward`` takes the dataset indices of the batch's samples, ``forward(x, y, index=...)``
    ((B,) int64 rows of the training set, ``data.classes`` subsets renumbered from 0, global under DDP):
    e.g. CRD's memory bank of ``num_samples`` rows."""

    views: ClassVar[int] = 1
    """Independently augmented views per training image; with V > 1, ``forward`` gets x of shape
    (B, V, ...) (the trainer builds its loader with ``views=V``)."""

    strong_views: ClassVar[bool] = False
    """With ``views`` > 1: the views after the first are also strongly augmented (RandAugment with two
    operations and Cutout, MLKD's official recipe), drawn from the epoch's plan like the crops."""

    manual_gradient_sync: ClassVar[bool] = False
    """True when ``backward`` all-reduces the gradients itself: under DDP the trainer then runs
    ``forward`` and ``backward`` inside ``no_sync()`` (e.g. DHKD's gradient alignment, which must project
    the global-batch gradients). A subclass may set it per instance from its config."""

    extra_heads: ClassVar[dict[str, str]] = {}
    """Trainable classifier heads on the student's features besides its own, ``{label: submodule}``
    (the dual-head methods: ``{"aux": "aux_head"}``): saved in the run's model files beside the student
    (a ``Linear`` or a ``Sequential`` of ``Linear``/``BatchNorm1d``/``Dropout``/``ReLU``), read back by
    ``Run.heads``; ``kdcollapse analyze`` reports each one's accuracy as ``accuracy_<label>``. Other
    trainable modules (connectors, projection heads) are never saved in the model files."""

    student: Classifier
    """The network being trained; the per-epoch collapse metrics read its features and head."""

    teacher: FrozenTeacher | None
    """The frozen teacher (``None`` without one), online or stored logits as the trainer chose from
    :meth:`teacher_request`; the method reads it through :meth:`read_teacher`, never trains it."""

    def __init__(
        self,
        student: nn.Module,
        config,
        *,
        num_classes: int,
        teacher: FrozenTeacher | None = None,
        label_smoothing: float = 0.0,
        num_samples: int | None = None,
        train_labels: torch.Tensor | None = None,
    ):
        super().__init__()
        self.student = as_classifier(student)
        self.config = config
        self.num_classes = num_classes
        self.teacher = teacher
        self.request = type(self).teacher_request(config)
        # The training set's labels, (N,) int64 in dataset order, and its size N (a memory bank's rows); None
        # when not known (built outside the trainer). The trainer passes the whole set's, global under DDP.
        self.train_labels, self.num_samples = check_train_labels(train_labels, num_samples, num_classes)
        self.label_smoothing = label_smoothing
        self.epoch = 0  # 0-based, set by on_epoch_start
        # Training inputs are x = (u - input_mean) / input_std of images u in [0, 1], per channel.
        self.input_mean: tuple[float, ...] = (0.0,)
        self.input_std: tuple[float, ...] = (1.0,)

    def read_teacher(self, x: torch.Tensor) -> TeacherOutput:
        """The teacher's answer to this method's :meth:`teacher_request` for inputs ``x``."""
        return self.teacher.read(x, self.request)

    def optimizer_groups(self) -> list[dict[str, Any]]:
        """The parameter groups of the run's optimizer, read once after construction: by default one group
        of every trainable parameter (the student and any module the method owns: connectors, regressors,
        projection heads). A method whose official code trains some modules with another learning rate or
        weight decay returns several groups, ``{"params": [...], "lr_scale": f, "weight_decay": w}``:
        ``lr_scale`` multiplies ``optim.lr`` and follows the schedule; other keys are passed to torch.
        Every trainable parameter must be in exactly one group."""
        return [{"params": [p for p in self.parameters() if p.requires_grad]}]

    def cross_entropy(self, logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, target, label_smoothing=self.label_smoothing)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        """One training step's losses, called in train mode (through DDP when distributed): a dict with
        ``loss`` (the scalar to minimise), ``logits`` (main-head logits, for the training accuracy) and
        any named scalar parts, each logged as ``train_<name>`` (epoch mean). With ``needs_index`` the
        trainer calls ``forward(x, y, index=index)``."""
        raise NotImplementedError

    def backward(self, out: dict[str, torch.Tensor], scale: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Fill ``.grad`` of the trainable parameters from ``forward``'s ``out``, after the trainer's
        ``zero_grad``. ``scale`` is the AMP loss scaler (or identity); apply it to every loss you
        differentiate."""
        scale(out["loss"]).backward()

    def after_step(self) -> None:
        """Called after every optimizer step (e.g. to remove a weight perturbation or update an average)."""

    @property
    def sums_batch_gradients(self) -> bool:
        """Whether summing the gradients of several batches (``optim.accumulate`` > 1) trains this method on
        their union: false when ``backward`` transforms each batch's gradient (DHKD's alignment, see
        ``manual_gradient_sync``) or ``forward`` perturbs the weights (AWP)."""
        return not self.manual_gradient_sync

    @property
    def divergence_hint(self) -> str | None:
        """A sentence the trainer adds to its error when the training loss becomes NaN or inf, naming a
        cause specific to this method's settings (e.g. the official BinaryKL clamp); ``None``: nothing to
        add."""
        return None

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        """Main-head logits in eval mode; the trainer's test accuracy and loss use these."""
        return self.student(x)

    def inference_model(self) -> nn.Module:
        """The network saved as the run's model file (``model.safetensors``, ``best.safetensors``) at
        every epoch end: the student, or e.g. an average of its weights kept by the method."""
        return self.student

    def set_input_normalization(self, mean: Sequence[float], std: Sequence[float]) -> None:
        """Called once after construction. The trainer's inputs are standardised, x = (u - mean) / std
        per channel, of images u in [0, 1]; methods that need u (adversarial training attacks it) read
        it from here."""
        self.input_mean, self.input_std = tuple(mean), tuple(std)

    def on_epoch_start(self, epoch: int) -> None:
        """Called before the first step of the 0-based ``epoch`` (also the first epoch of a resume)."""
        self.epoch = epoch

    def on_epoch_end(self, epoch: int) -> None:
        """Called on every process after the last step of ``epoch``, before ``epoch_metrics`` and the
        checkpoint (collectives are allowed: every process calls it)."""

    def epoch_metrics(self) -> dict[str, float]:
        """Method-specific numbers for this epoch's record in ``metrics.jsonl`` (called after
        ``on_epoch_end``)."""
        return {}

    def extra_state(self) -> dict[str, torch.Tensor]:
        """Tensors (not parameters or buffers) that a resumed run needs, e.g. accumulated class weights;
        saved as ``extra.<key>`` in ``checkpoint.safetensors`` after ``on_epoch_end``."""
        return {}

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        """Restore what :meth:`extra_state` returned (on resume, before the first ``on_epoch_start``);
        raise :class:`~kdcollapse.errors.CheckpointError` for state that does not fit."""
