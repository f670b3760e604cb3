"""The teacher seam: what a method reads from its teacher (:class:`TeacherRequest`, declared once by the
method), what the teacher gives back (:class:`TeacherOutput`), and its two implementations: the online
:class:`FrozenTeacher` and :class:`StoredLogits` (``teacher.cache=logits``: one teacher pass before
training), the second chosen by the trainer only where the request allows it (:func:`check_stored_logits`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.models import Classifier, FeatureInfo, FeatureSpec, as_classifier


@dataclass(frozen=True)
class TeacherRequest:
    """Everything a method reads from its teacher, declared once (``Method.teacher_request(config)``).

    ``features``: the (B, d) penultimate feature; ``stages``: the stage maps (indices into the teacher's
    ``feature_info``), before their last ReLU when ``pre_act`` (OFD); ``temperature``: set when the method
    reads the logits only through softmax(z_t / τ) at this τ (KD, DKD), which lets the trainer store only the
    top-k logits (``teacher.cache_topk``); ``batch_stats``: the teacher's BatchNorms normalise with the
    batch's own statistics, as in train mode (mdistiller's OFD trains with its teacher in train mode),
    without changing their running statistics (:func:`batch_statistics`). A request for logits alone may be
    served by stored logits.
    """

    features: bool = False
    stages: tuple[int, ...] = ()
    pre_act: bool = False
    temperature: float | None = None
    batch_stats: bool = False

    @property
    def logits_only(self) -> bool:
        """Whether only the logits are read, so that stored logits can serve the request."""
        return not self.features and not self.stages and not self.batch_stats


@dataclass(frozen=True)
class TeacherOutput:
    """The teacher's answer to a :class:`TeacherRequest`, float32 tensors without gradient: ``logits``
    (B, K); ``features`` (B, d) or ``None`` when not requested; ``maps``: one (B, C, H, W) map per requested
    stage, in the request's order."""

    logits: torch.Tensor
    features: torch.Tensor | None = None
    maps: tuple[torch.Tensor, ...] = ()


LOGITS = TeacherRequest()
BATCH_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)


@contextlib.contextmanager
def batch_statistics(model: nn.Module):
    """Within the block, every BatchNorm of ``model`` normalises with the statistics of the batch it sees
    (as in train mode) and leaves its running statistics and batch count as they are; other layers keep
    their mode. Restored on exit."""
    norms = [m for m in model.modules() if isinstance(m, BATCH_NORMS)]
    saved = [(m.training, m.track_running_stats) for m in norms]
    for m in norms:
        m.training, m.track_running_stats = True, False  # BatchNorm then passes no running buffers to torch
    try:
        yield
    finally:
        for m, (training, track) in zip(norms, saved):
            m.training, m.track_running_stats = training, track


def _float32(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.float32, copy=True)


class FrozenTeacher:
    """A trained model used only for inference: eval mode, no gradients, never in an optimizer or DDP.

    Deliberately not an ``nn.Module``, so assigning it to a method registers nothing: the teacher is
    absent from ``parameters()``, ``state_dict()`` and DDP's buckets, and ``method.train()`` cannot
    switch it out of eval mode. Only a request with ``batch_stats`` makes its BatchNorms use the batch's
    statistics, for that read alone.
    """

    def __init__(self, model: nn.Module, features: FeatureSpec = None):
        """``model``: a :class:`Classifier`, or any module with a feature spec (see :func:`as_classifier`)."""
        self.model: Classifier = as_classifier(model, features).eval().requires_grad_(False)

    @property
    def num_classes(self) -> int:
        return self.model.num_classes

    @property
    def feature_info(self) -> list[FeatureInfo]:
        """The teacher's stages (channels, reduction), e.g. to size a method's connectors."""
        return self.model.feature_info

    def describe(self) -> str:
        """How the teacher runs, as recorded in ``run.json``."""
        return "online"

    def to(self, *args, **kwargs) -> FrozenTeacher:
        self.model.to(*args, **kwargs)
        return self

    def select(self, index: torch.Tensor) -> None:
        """The dataset indices of the next training batch (read only by stored logits)."""

    def read(self, x: torch.Tensor, request: TeacherRequest = LOGITS) -> TeacherOutput:
        """What ``request`` asks for, float32 whatever autocast is active.

        The forward runs in ``inference_mode`` (no autograd bookkeeping at all) in the caller's autocast
        precision and memory layout; the float32 copies made after it are ordinary tensors, which the
        student's losses may save for their backward pass (inference tensors may not be saved)."""
        norms = batch_statistics(self.model) if request.batch_stats else contextlib.nullcontext()
        with torch.inference_mode(), norms:
            if request.stages:
                h, maps = self.model.forward_intermediates(x, list(request.stages), pre_act=request.pre_act)
            else:
                h, maps = self.model.forward_features(x), []
            z = self.model.forward_head(h)
        return TeacherOutput(_float32(z), _float32(h) if request.features else None,
                             tuple(_float32(m) for m in maps))

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(features (B, d), logits (B, K)): ``read`` with ``features=True``."""
        out = self.read(x, TeacherRequest(features=True))
        return out.features, out.logits

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        """(B, K) logits, float32, without gradient."""
        return self.read(x).logits


def top_logits(logits: torch.Tensor, k: int, temperature: float) -> dict[str, torch.Tensor]:
    """The ``k`` largest logits of each row (``values``, ``indices``) and one ``fill`` logit for the other
    K − k classes, chosen so that softmax(ẑ / τ) of the expanded row (:func:`expand_logits`) gives every
    top-k probability and the other classes' total probability exactly, that total spread evenly:
    fill = τ · (logsumexp of the others' z / τ − log(K − k)). Computed in float64."""
    values, indices = logits.topk(k, dim=1)
    scaled = (logits.double() / temperature).scatter(1, indices, float("-inf"))
    fill = temperature * (scaled.logsumexp(1) - math.log(logits.shape[1] - k))
    return {"values": values.float(), "indices": indices.to(torch.int32), "fill": fill.float()}


def expand_logits(values: torch.Tensor, indices: torch.Tensor, fill: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(B, K) logits from stored top-k ``values`` at ``indices`` and each row's ``fill`` elsewhere."""
    rows = fill.unsqueeze(1).expand(len(fill), num_classes).clone()
    return rows.scatter_(1, indices.long(), values)


class StoredLogits(FrozenTeacher):
    """A teacher whose logits of every training image were computed once, before training.

    Equal to the online teacher when a training input is a function of its image alone: no crop, no
    flip, one view (:func:`check_stored_logits`); then a distillation epoch costs about a student-only epoch.
    The trainer names the images of each batch (``select``) before the method asks for their logits.
    Stores N x K float32 values (60,000 x 10 for Fashion-MNIST: 2.4 MB), or with ``top`` (the rows of
    :func:`top_logits`) N x (2k + 1) values: ImageNet's 1.28 M x 1000 float32 logits take 5.1 GB, its top 10
    with their fill 108 MB.
    """

    def __init__(self, teacher: FrozenTeacher, logits: torch.Tensor | None = None, *,
                 top: dict[str, torch.Tensor] | None = None, num_classes: int | None = None):
        super().__init__(teacher.model)
        if (logits is None) == (top is None):
            raise KdcollapseError("stored teacher logits: give either all logits or top-k ones, not both")
        self.stored, self.top = logits, top
        self.classes = logits.shape[1] if logits is not None else num_classes or teacher.num_classes
        self._index: torch.Tensor | None = None

    def describe(self) -> str:
        return "stored logits" if self.top is None else \
            f"stored logits (top {self.top['values'].shape[1]} of {self.classes})"

    def select(self, index: torch.Tensor) -> None:
        """The dataset indices of the next batch's images, in batch order."""
        self._index = index

    def read(self, x: torch.Tensor, request: TeacherRequest = LOGITS) -> TeacherOutput:
        if not request.logits_only:
            raise KdcollapseError("teacher.cache=logits stores the teacher's logits only, not its features")
        if self._index is None or len(self._index) != len(x):
            raise KdcollapseError(f"stored teacher logits: the batch of {len(x)} images was not selected; call "
                                  "select(indices) before each batch")
        if self.top is None:
            return TeacherOutput(self.stored.index_select(0, self._index))
        rows = {k: v.index_select(0, self._index) for k, v in self.top.items()}
        return TeacherOutput(expand_logits(rows["values"], rows["indices"], rows["fill"], self.classes))


def store_logits(teacher: FrozenTeacher, batches: Iterable[tuple[torch.Tensor, torch.Tensor]],
                 request: TeacherRequest, *, num_classes: int, topk: int | None = None,
                 prepare: Callable[[torch.Tensor], torch.Tensor] = lambda x: x,
                 precision: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext) -> StoredLogits:
    """One teacher pass over ``batches`` (the unaugmented training images in dataset order, each made ready by
    ``prepare`` and run under ``precision()``); with ``topk`` each batch is reduced to its top-k logits at
    the request's temperature at once (the full N x K never exists)."""
    keep_all = topk is None or topk >= num_classes
    rows = []
    for x, _ in batches:
        with precision():
            z = teacher.logits(prepare(x))
        rows.append(z if keep_all else top_logits(z, topk, request.temperature))
    if keep_all:
        return StoredLogits(teacher, torch.cat(rows))
    top = {key: torch.cat([r[key] for r in rows]) for key in rows[0]}
    return StoredLogits(teacher, top=top, num_classes=num_classes)


def check_stored_logits(method_name: str, request: TeacherRequest, data_cfg, dataset, *, views: int = 1,
                        topk: int | None = None) -> None:
    """Refuse ``teacher.cache=logits`` where stored logits would differ from the online teacher's, and
    ``teacher.cache_topk`` for a method that reads more of the teacher than softmax(z_t / τ)."""
    if topk is not None and request.temperature is None:
        raise ConfigError(f"teacher.cache_topk keeps the top-k probabilities exact at the method's temperature; method "
                          f"'{method_name}' reads the teacher's logits otherwise too. Remove teacher.cache_topk")
    why = None
    if not request.logits_only:
        why = f"method '{method_name}' also uses the teacher's features, which are not stored"
    elif data_cfg.crop_padding or data_cfg.flip:
        why = (f"the training images are augmented (data.crop_padding={data_cfg.crop_padding}, "
               f"data.flip={str(data_cfg.flip).lower()}), so the teacher sees a new input every epoch")
    elif views > 1 or getattr(dataset, "random_resized_crop", False):
        why = "the training images are augmented (several views or random-resized crops)"
    if why:
        raise ConfigError(f"teacher.cache=logits reuses one teacher output per training image, exact only for "
                          f"unaugmented images: {why}. Use teacher.cache=off")
