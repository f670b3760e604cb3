"""The one model loader: ``load_model`` reads a model file, or a run directory at its last commit, and
checks it against the data it will see; ``load_teacher`` (a distillation run's frozen teacher), ``Run.model``
and ``analyze``'s weights and teachers all go through it. The file format is ``_checkpoint.read_model``'s,
the commit ``_commit.committed_path``'s."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from kdcollapse.config import TeacherConfig
from kdcollapse.data import make_loader
from kdcollapse.distributed import resolve_device
from kdcollapse.errors import CheckpointError, ConfigError, DataError, KdcollapseError
from kdcollapse.methods import FrozenTeacher
from kdcollapse.models import evaluating
from kdcollapse.runs._checkpoint import read_model
from kdcollapse.runs._commit import committed_path
from kdcollapse.runs._record import check_config_unedited


def _checked_device(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``; one that is not valid or not present (a GPU on a machine without one)
    is :func:`resolve_device`'s one-line ``ConfigError`` (the CPU and ``meta`` pass unchanged)."""
    try:
        parsed = torch.device(device)
    except (RuntimeError, TypeError):
        parsed = None
    return parsed if parsed is not None and parsed.type in ("cpu", "meta") else resolve_device(device, option="device")


def load_model(path: str | Path, device: str | torch.device = "cpu", *, model_name: str | None = None,
               num_classes: int | None = None, in_channels: int | None = None, model_kwargs: dict | None = None,
               dataset=None) -> tuple[nn.Module, dict]:
    """``(model, meta)`` from a model file (``model.safetensors``, a plain safetensors or ``.pth``/``.pt``
    state dict) or from a run directory at its last commit (the weights ``state.json`` records, also between
    a commit and its renames; a file that is not the committed one is refused, naming ``--resume``).

    Files written by kdcollapse carry the model name and options; a bare file needs ``model_name`` and
    ``num_classes`` (and ``in_channels``), which ``dataset`` gives when they are not. With ``dataset`` the
    model must also share its label space and take one of its inputs. ``model_kwargs`` override the file's
    model options."""
    device = _checked_device(device)  # a bad or absent device is a one-line error before any reading
    path = Path(path)
    file = committed_path(path, "model.safetensors") if path.is_dir() else path
    if dataset is not None:
        num_classes, in_channels = num_classes or dataset.num_classes, in_channels or dataset.in_channels
    model, meta = read_model(file, device, model_name=model_name, num_classes=num_classes, in_channels=in_channels,
                             model_kwargs=model_kwargs)
    if dataset is not None:
        check_inputs(model, dataset, model_name or meta["model"])
    return model, meta


def check_inputs(model: nn.Module, dataset, name: str) -> None:
    """Raise a clear error if ``model`` cannot take the dataset's inputs (tried on one sample)."""
    device = next(model.parameters()).device
    x, _ = next(iter(make_loader(dataset.subset(indices=[0]), 1, train=False, device=device, seed=0)))
    try:
        with evaluating([model]):
            model(x)
    except (RuntimeError, KdcollapseError) as err:
        raise DataError(
            f"model '{name}' cannot take the inputs of dataset '{dataset.name}' (shape "
            f"{tuple(dataset.input_shape)}): {str(err).splitlines()[0]}"
        ) from None


def load_teacher(cfg: TeacherConfig, dataset) -> FrozenTeacher:
    """A ``FrozenTeacher`` from a run directory or model file (``teacher.checkpoint``) or model name + weights
    file, trained on ``dataset`` (its stored-logits form lives with the teachers: ``kdcollapse.methods.StoredLogits``)."""
    if cfg.checkpoint:
        if cfg.weights:
            raise ConfigError("give either teacher.checkpoint or teacher.model + teacher.weights, not both")
        source = str(cfg.checkpoint)
        if Path(source).is_dir():  # a run directory: its record must be the one kdcollapse wrote
            check_config_unedited(Path(source))
        model, meta = load_model(source, model_name=cfg.model)
    elif cfg.weights:
        if not cfg.model:
            raise ConfigError("teacher.weights needs teacher.model (the registered model name)")
        source = cfg.weights
        model, meta = load_model(source, model_name=cfg.model, dataset=dataset)
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
