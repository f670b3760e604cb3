"""Loading the frozen teacher of a distillation run, with the checks that prevent silent mistakes (its
stored-logits form lives with the teachers: ``kdcollapse.methods.StoredLogits``)."""

from __future__ import annotations

from pathlib import Path

from kdcollapse.config import TeacherConfig
from kdcollapse.errors import CheckpointError, ConfigError
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
