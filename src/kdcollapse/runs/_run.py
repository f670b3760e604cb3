"""``Run``: one object for a finished or running ``kdcollapse train``/``distill`` run directory."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path

import torch
from torch import nn

from kdcollapse.config import RunConfig, load_config
from kdcollapse.data import make_loader
from kdcollapse.errors import CheckpointError, DataError, KdcollapseError
from kdcollapse.methods import get_method
from kdcollapse.models import evaluating
from kdcollapse.models.heads import layers_from_spec
from kdcollapse.runs import _checkpoint as ckpt
from kdcollapse.runs._commit import committed_file, committed_path, load_model
from kdcollapse.runs._data import UserData, check_split, run_dataset
from kdcollapse.runs._run_dir import read_metrics
from kdcollapse.runs._teacher import load_teacher

MODEL_FILES = {"model": "model.safetensors", "best": "best.safetensors"}


class Run:
    """A run directory: its config, its data exactly as training saw it (``data.classes``, subsets), its
    model (last or best), its teacher and the extra trainable heads of its method.

    A run trained on data passed from Python (``fit(cfg, train_data=..., test_data=...)``) gets the same
    data here again (checked against the fingerprint in its ``run.json``); without it, ``dataset`` says so.

    >>> Run("no/such/dir")
    Traceback (most recent call last):
    kdcollapse.errors.CheckpointError: run directory not found: no/such/dir
    """

    def __init__(self, run_dir: str | Path, *, train_data=None, test_data=None, val_data=None):
        self.dir = Path(run_dir)
        if not self.dir.is_dir():
            raise CheckpointError(f"run directory not found: {self.dir}")
        if not (self.dir / "config.yaml").is_file():
            raise CheckpointError(
                f"{self.dir} holds no config.yaml, so it is not a `kdcollapse train` run directory"
            )
        self._files: dict[int, Path] = {}  # id of a model read by model() -> its file (heads() reads it)
        self.user_data = UserData.of(train_data, test_data, val_data)
        if self.user_data is not None:
            self.user_data.check_run(self.dir)

    @cached_property
    def config(self) -> RunConfig:
        return load_config(self.dir / "config.yaml")

    def dataset(self, split: str, per_class: int | None = None):
        """Split ``split`` as the run saw it (see :func:`kdcollapse.runs.run_dataset`)."""
        return run_dataset(self.config, split, per_class, user=self.user_data)

    def metrics(self) -> list[dict]:
        """The per-epoch records of ``metrics.jsonl`` up to the last committed epoch (``state.json``), also
        between a crash and its ``--resume``."""
        path, state = committed_file(self.dir, "metrics.jsonl")
        records = read_metrics(path or self.dir)
        return records if state is None else [r for r in records if r.get("epoch", 0) <= state["epoch"]]

    def finished(self) -> bool:
        """Whether the run recorded its last epoch (``train.epochs``); a model file alone is also written by
        an interrupted run."""
        if not (self.dir / "metrics.jsonl").is_file():
            return False
        return any(r.get("epoch") == self.config.train.epochs for r in self.metrics())

    def model(self, which: str = "model", device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
        """``(model, meta)`` of the last (``which="model"``) or best (``"best"``) committed epoch."""
        if which not in MODEL_FILES:
            raise KdcollapseError(f"unknown model file {which!r}; valid: {', '.join(MODEL_FILES)}")
        path = committed_path(self.dir, MODEL_FILES[which])
        model, meta = load_model(path, device)
        self._files[id(model)] = path
        return model, meta

    def teacher(self, dataset=None, device: str | torch.device = "cpu") -> nn.Module | None:
        """The run's frozen teacher (``None`` for a run trained without one)."""
        cfg = self.config
        if not (cfg.teacher.checkpoint or cfg.teacher.weights):
            return None
        return load_teacher(cfg.teacher, dataset or self.dataset("test")).model.to(device)

    def heads(self, model: nn.Module, meta: dict, device: str | torch.device = "cpu") -> dict[str, nn.Module]:
        """Trainable heads of the method beyond the student (a dual-head student's ``aux``), with the weights
        of the same epoch as ``model`` (from :meth:`model`): read from its model file, which carries them.
        Runs written before model files carried them: a linear head is read from the checkpoint."""
        path = self._files.get(id(model))
        if path is not None and "extra_heads" in meta:
            tensors, _ = ckpt.load_tensors(path, device=device)
            return ckpt.read_extra_heads(tensors, meta)
        return self._linear_heads_of_checkpoint(meta, device)

    def _linear_heads_of_checkpoint(self, meta: dict, device) -> dict[str, nn.Module]:
        extra = get_method(self.config.method.name).extra_heads
        if not extra or not (self.dir / "checkpoint.safetensors").is_file():
            return {}
        path = committed_path(self.dir, "checkpoint.safetensors")
        tensors, state_meta = ckpt.load_tensors(path, device=device)
        if state_meta.get("epoch") != meta.get("epoch"):
            raise CheckpointError(
                f"{self.dir}: model.safetensors is from epoch {meta.get('epoch')} but checkpoint.safetensors "
                f"(which holds the auxiliary head) from epoch {state_meta.get('epoch')}"
            )
        heads = {}
        for label, attr in extra.items():
            state = ckpt.split_prefix(tensors, f"method.{attr}.")
            if set(state) == {"weight", "bias"} and state["weight"].dim() == 2:
                out_features, in_features = state["weight"].shape
                spec = [{"type": "Linear", "in": in_features, "out": out_features, "bias": True}]
                heads[label] = layers_from_spec(spec, state)
        return heads


def load_model_file(path, dataset, device, name: str | None = None, kwargs: dict | None = None):
    """``(model, meta)`` from a run directory or safetensors file, checked against ``dataset``'s label space
    and input shape. Files written by kdcollapse carry the model name and options; a bare file needs
    ``name``."""
    path = Path(path)
    file = committed_path(path, "model.safetensors") if path.is_dir() else path
    network, meta = ckpt.read_model(file, device, model_name=name, num_classes=dataset.num_classes,
                                    in_channels=dataset.in_channels, model_kwargs=kwargs)
    check_inputs(network, dataset, name or meta["model"])
    return network, meta


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


__all__ = ["Run", "check_inputs", "check_split", "load_model_file", "run_dataset"]
