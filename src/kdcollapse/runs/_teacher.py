"""Loading the frozen teacher of a distillation run, with the checks that prevent silent mistakes, and its
stored-logits form (``teacher.cache=logits``)."""

from __future__ import annotations

from pathlib import Path

import torch

from kdcollapse.config import TeacherConfig
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.methods import FrozenTeacher
from kdcollapse.runs._checkpoint import load_model


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


class TeacherLogitCache(FrozenTeacher):
    """A teacher whose logits of every training image were computed once, before training.

    Equal to the online teacher when a training input is a function of its image alone: no crop, no
    flip, one view (``check_teacher_cache``); then a distillation epoch costs about a student-only epoch.
    The trainer names the images of each batch (``select``) before the method asks for their logits.
    Stores N x K float32 values (60,000 x 10 for Fashion-MNIST: 2.4 MB).
    """

    def __init__(self, teacher: FrozenTeacher, logits: torch.Tensor):
        super().__init__(teacher.model)
        self.stored = logits
        self._index: torch.Tensor | None = None

    def select(self, index: torch.Tensor) -> None:
        """The dataset indices of the next batch's images, in batch order."""
        self._index = index

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        if self._index is None or len(self._index) != len(x):
            raise KdcollapseError(f"stored teacher logits: the batch of {len(x)} images was not selected; call "
                                  "select(indices) before each batch")
        return self.stored.index_select(0, self._index)

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise KdcollapseError("teacher.cache=logits stores the teacher's logits only, not its features")


def check_teacher_cache(method_name: str, method_cls, data_cfg, dataset) -> None:
    """Refuse ``teacher.cache=logits`` where stored logits would differ from the online teacher's."""
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
