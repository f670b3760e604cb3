"""What an analysis looks at: a model, its extra heads, an optional teacher and one split of data."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from kdcollapse.analysis._pass import user_split
from kdcollapse.data import load_dataset
from kdcollapse.errors import KdcollapseError
from kdcollapse.models import FeatureSpec
from kdcollapse.runs import Run, check_split, committed_path, file_digest, load_model, source_of


@dataclass
class Subject:
    """A trained model with the split to analyse.

    ``model``: a :class:`~kdcollapse.models.Classifier` or any module with the feature spec ``features``
    (see :func:`~kdcollapse.models.as_classifier`); ``dataset``: a kdcollapse dataset, or a torch
    ``Dataset`` / ``DataLoader`` of ``(x, y)`` (read once, see :func:`~kdcollapse.analysis.user_split`, and
    standardised as the model was trained when kdcollapse loaded it: ``model.input_normalization``; a
    kdcollapse dataset with another standardisation is refused);
    ``heads``: extra heads on the model's features (a dual-head student's ``aux``); ``teacher``: the model
    whose logits each head is compared with (DHKD App. H); ``info``: provenance for the report.
    """

    model: nn.Module
    dataset: object  # TensorDataset | FolderDataset
    split: str
    heads: dict[str, nn.Module] = field(default_factory=dict)
    teacher: nn.Module | None = None
    info: dict = field(default_factory=dict)
    features: FeatureSpec = None

    def __post_init__(self) -> None:
        trained = getattr(self.model, "input_normalization", None)  # set by kdcollapse.runs.load_model
        self.dataset = user_split(self.dataset, trained)
        classes = getattr(self.model, "num_classes", None)
        if isinstance(classes, int) and classes != self.dataset.num_classes:
            raise KdcollapseError(f"the model has {classes} classes, dataset '{self.dataset.name}' has "
                                  f"{self.dataset.num_classes} (labels 0..{self.dataset.num_classes - 1})")
        if trained is not None and not _same_normalization(trained, (self.dataset.mean, self.dataset.std)):
            raise KdcollapseError(
                f"the model was trained on inputs standardised with mean {list(trained[0])}, std {list(trained[1])}, "
                f"but dataset '{self.dataset.name}' applies mean {list(self.dataset.mean)}, std "
                f"{list(self.dataset.std)}; pass the torch Dataset itself (it then gets the model's), or "
                "load_run(Run(run_dir, ...), split)")


def _same_normalization(a: tuple, b: tuple) -> bool:
    """Whether two ``(mean, std)`` pairs standardise alike (one value stands for every channel)."""
    def channels(values, n):
        return [float(v) for v in values] * (n if len(values) == 1 else 1)

    n = max(len(a[0]), len(b[0]))
    return all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-9)
               for u, v in zip(a, b) for x, y in zip(channels(u, n), channels(v, n)))


def load_run(
    run_dir: str | Path | Run, split: str, *, device: torch.device, per_class: int | None = None,
    teacher: str | Path | None = None,
) -> Subject:  # fmt: skip
    """The final model of a ``kdcollapse train``/``distill`` run on split ``split`` as the run saw it
    (``data.classes``, subsets), its extra heads and its teacher.

    ``teacher`` (a run directory or model file) overrides the run's own teacher, and gives one to runs
    trained without. A run trained on data passed from Python is given as ``Run(run_dir, train_data=...,
    test_data=...)``.
    """
    run = run_dir if isinstance(run_dir, Run) else Run(run_dir)
    check_split(split)
    cfg = run.config
    dataset = run.dataset(split, per_class)
    model, meta = run.model("model", device)
    subject = Subject(model, dataset, split, heads=run.heads(model, meta, device), info={
        "run_dir": str(run.dir), "model": meta.get("model"), "method": cfg.method.name, "dataset": cfg.data.name,
        "epoch": meta.get("epoch"), "seed": cfg.seed, "per_class": per_class,
    } | source_of(run.dir))  # fmt: skip
    if teacher is not None:
        subject.teacher = load_model(teacher, device, dataset=dataset)[0]
        subject.info["teacher"] = str(teacher)
    else:
        subject.teacher = run.teacher(dataset, device)
        if subject.teacher is not None:
            subject.info["teacher"] = cfg.teacher.checkpoint or cfg.teacher.weights
    return subject


def load_weights(
    model: str, weights: str | Path, data: str, split: str, *, device: torch.device, root: str | None = None,
    model_kwargs: dict | None = None, per_class: int | None = None, seed: int = 0,
    teacher: str | Path | None = None,
) -> Subject:  # fmt: skip
    """A model built by name with a safetensors weights file, and split ``split`` of dataset ``data``
    (``per_class`` samples per class drawn with ``seed`` if given); ``teacher`` as in :func:`load_run`."""
    dataset = load_dataset(data, check_split(split), root=root)
    if per_class:
        dataset = dataset.subset(per_class, seed=seed)
    network, meta = load_model(weights, device, model_name=model, model_kwargs=model_kwargs, dataset=dataset)
    info = {"weights": str(weights), "model": model, "method": meta.get("method"), "dataset": data,
            "epoch": meta.get("epoch"), "seed": seed, "per_class": per_class,
            "weights_sha256": file_digest(committed_path(Path(weights), "model.safetensors") if Path(weights).is_dir()
                                          else Path(weights))}
    subject = Subject(network, dataset, split, info=info)
    if teacher is not None:
        subject.teacher = load_model(teacher, device, dataset=dataset)[0]
        subject.info["teacher"] = str(teacher)
    return subject
