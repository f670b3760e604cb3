"""Loading the frozen teacher of a distillation run, with the checks that prevent silent mistakes, and its
stored-logits form (``teacher.cache=logits``)."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from kdcollapse.config import TeacherConfig
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.methods import FrozenTeacher
from kdcollapse.runs._commit import load_model


def load_teacher(cfg: TeacherConfig, dataset) -> FrozenTeacher:
    """A ``FrozenTeacher`` from a run directory (``teacher.checkpoint``) or model name + weights file."""
    if cfg.checkpoint:
        if cfg.weights:
            raise ConfigError("give either teacher.checkpoint or teacher.model + teacher.weights, not both")
        path = Path(cfg.checkpoint)
        model, meta = load_model(path, model_name=cfg.model)
        source = str(path)
    elif cfg.weights:
        if not cfg.model:
            raise ConfigError("teacher.weights needs teacher.model (the registered model name)")
        model, meta = load_model(cfg.weights, model_name=cfg.model, num_classes=dataset.num_classes,
                                 in_channels=dataset.in_channels)
        source = cfg.weights
    else:
        raise ConfigError(
            "this method distils from a teacher: set teacher.checkpoint=RUN_DIR (a `kdcollapse train` run) "
            "or teacher.model=NAME teacher.weights=FILE.safetensors"
        )
    trained_on = meta.get("dataset")
    if trained_on and trained_on != dataset.name:
        raise CheckpointError(f"the teacher in {source} was trained on '{trained_on}', but this run uses "
                              f"'{dataset.name}'")
    if model.num_classes != dataset.num_classes:
        raise CheckpointError(
            f"the teacher in {source} has {model.num_classes} classes but dataset '{dataset.name}' has "
            f"{dataset.num_classes}; teacher and student must share the label space"
        )
    return FrozenTeacher(model)


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


class TeacherLogitCache(FrozenTeacher):
    """A teacher whose logits of every training image were computed once, before training.

    Equal to the online teacher when a training input is a function of its image alone: no crop, no
    flip, one view (``check_teacher_cache``); then a distillation epoch costs about a student-only epoch.
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

    def select(self, index: torch.Tensor) -> None:
        """The dataset indices of the next batch's images, in batch order."""
        self._index = index

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self._index is None or len(self._index) != len(x):
            raise KdcollapseError(f"stored teacher logits: the batch of {len(x)} images was not selected; call "
                                  "select(indices) before each batch")
        if self.top is None:
            return self.stored.index_select(0, self._index)
        rows = {k: v.index_select(0, self._index) for k, v in self.top.items()}
        return expand_logits(rows["values"], rows["indices"], rows["fill"], self.classes)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise KdcollapseError("teacher.cache=logits stores the teacher's logits only, not its features")


def check_teacher_cache(method_name: str, method_cls, data_cfg, dataset, topk: int | None = None) -> None:
    """Refuse ``teacher.cache=logits`` where stored logits would differ from the online teacher's, and
    ``teacher.cache_topk`` for a method that reads more of the teacher than softmax(z_t / τ)."""
    if topk is not None and not method_cls.teacher_softmax_only:
        raise ConfigError(f"teacher.cache_topk keeps the top-k probabilities exact at the method's temperature; method "
                          f"'{method_name}' reads the teacher's logits otherwise too. Remove teacher.cache_topk")
    why = None
    if getattr(method_cls, "teacher_features", False):
        why = f"method '{method_name}' also uses the teacher's features, which are not stored"
    elif data_cfg.crop_padding or data_cfg.flip:
        why = (f"the training images are augmented (data.crop_padding={data_cfg.crop_padding}, "
               f"data.flip={str(data_cfg.flip).lower()}), so the teacher sees a new input every epoch")
    elif method_cls.views > 1 or getattr(dataset, "random_resized_crop", False):
        why = "the training images are augmented (several views or random-resized crops)"
    if why:
        raise ConfigError(f"teacher.cache=logits reuses one teacher output per training image, exact only for "
                          f"unaugmented images: {why}. Use teacher.cache=off")
