"""What an analysis looks at: a model, its extra heads, an optional teacher and one split of data."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from kdcollapse.analysis._pass import evaluating
from kdcollapse.config import RunConfig, load_config
from kdcollapse.data import load_dataset
from kdcollapse.data._dataset import SPLITS
from kdcollapse.errors import CheckpointError, DataError, KdcollapseError, unknown_choice
from kdcollapse.models import create_model
from kdcollapse.train import _checkpoint as ckpt


@dataclass
class Subject:
    """A trained model with the split to analyse.

    ``heads``: extra heads on the model's features (a dual-head student's ``aux``); ``teacher``: the model
    whose logits each head is compared with (DHKD App. H); ``info``: provenance for the report.
    """

    model: nn.Module
    dataset: object  # TensorDataset | FolderDataset
    split: str
    heads: dict[str, nn.Module] = field(default_factory=dict)
    teacher: nn.Module | None = None
    info: dict = field(default_factory=dict)


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise DataError(unknown_choice("split", split, SPLITS))
    return split


def run_split(cfg: RunConfig, split: str, per_class: int | None = None):
    """The split a run trained or evaluated on (its ``data.*_per_class`` subset, drawn with the run's
    seed, as the trainer draws it), optionally cut to ``per_class`` samples per class with the same seed
    (the subset ``analysis.train_per_class`` gives the per-epoch metrics)."""
    dataset = load_dataset(cfg.data.name, check_split(split), root=cfg.data.root)
    for n in (getattr(cfg.data, f"{split}_per_class"), per_class):
        if n:
            dataset = dataset.subset(n, seed=cfg.seed)
    return dataset


def load_run(
    run_dir: str | Path, split: str, *, device: torch.device, per_class: int | None = None,
    teacher: str | Path | None = None,
) -> Subject:  # fmt: skip
    """The final model of a ``kdcollapse train``/``distill`` run, its extra heads and its teacher.

    The model comes from ``model.safetensors``. Methods with trainable parts beyond the student (a
    dual-head student's auxiliary head ``aux_head``, stored in ``checkpoint.safetensors`` of the same
    epoch) are rebuilt to recover them. ``teacher`` (a run directory or model file) overrides the run's
    own teacher, and gives one to runs trained without.
    """
    from kdcollapse.train._teacher import load_teacher

    run_dir = Path(run_dir)
    check_split(split)
    if not run_dir.is_dir():
        raise CheckpointError(f"run directory not found: {run_dir}")
    if not (run_dir / "config.yaml").is_file():
        raise CheckpointError(
            f"{run_dir} holds no config.yaml, so it is not a `kdcollapse train` run directory; analyse a "
            "bare weights file with --model NAME --weights FILE --data NAME"
        )
    cfg = load_config(run_dir / "config.yaml")
    dataset = run_split(cfg, split, per_class)
    model, meta = ckpt.load_model(run_dir / "model.safetensors", device)
    subject = Subject(model, dataset, split, info={
        "run_dir": str(run_dir), "model": meta.get("model"), "method": cfg.method.name, "dataset": cfg.data.name,
        "epoch": meta.get("epoch"), "seed": cfg.seed, "per_class": per_class,
    })  # fmt: skip
    if teacher is not None:
        subject.teacher = _load_model_file(teacher, dataset, device)[0]
        subject.info["teacher"] = str(teacher)
    elif cfg.teacher.checkpoint or cfg.teacher.weights:
        subject.teacher = load_teacher(cfg.teacher, dataset).model.to(device)
        subject.info["teacher"] = cfg.teacher.checkpoint or cfg.teacher.weights
    aux = _auxiliary_head(run_dir, cfg, model, meta, dataset, device)
    if aux is not None:
        subject.heads["aux"] = aux
    return subject


def _auxiliary_head(run_dir: Path, cfg: RunConfig, model, meta: dict, dataset, device) -> nn.Module | None:
    """The method's ``aux_head`` with its trained weights, if the method has one."""
    from kdcollapse.methods import FrozenTeacher, build_method

    path = run_dir / "checkpoint.safetensors"
    if not path.is_file():
        return None
    tensors, state_meta = ckpt.load_tensors(path, device=device)
    if not any(k.startswith("method.aux_head.") for k in tensors):
        return None
    if state_meta.get("epoch") != meta.get("epoch"):
        raise CheckpointError(
            f"{run_dir}: model.safetensors is from epoch {meta.get('epoch')} but checkpoint.safetensors (which "
            f"holds the auxiliary head) from epoch {state_meta.get('epoch')}"
        )
    # The method is rebuilt only to recover its auxiliary head; a stand-in teacher satisfies its checks.
    stand_in = FrozenTeacher(create_model(meta["model"], dataset.num_classes, meta.get("in_channels", 3),
                                          **meta.get("model_kwargs", {})))
    method = build_method(cfg.method, model, num_classes=dataset.num_classes, teacher=stand_in).to(device)
    ckpt.load_state(method, ckpt.split_prefix(tensors, "method."), str(path))
    return method.aux_head


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
    network, meta = _load_model_file(weights, dataset, device, model, model_kwargs)
    info = {"weights": str(weights), "model": model, "method": meta.get("method"), "dataset": data,
            "epoch": meta.get("epoch"), "seed": seed, "per_class": per_class}
    subject = Subject(network, dataset, split, info=info)
    if teacher is not None:
        subject.teacher = _load_model_file(teacher, dataset, device)[0]
        subject.info["teacher"] = str(teacher)
    return subject


def _load_model_file(path, dataset, device, name: str | None = None, kwargs: dict | None = None):
    """A model from a run directory or safetensors file, checked against the dataset's label space.

    Files written by kdcollapse carry the model name and options; a bare file needs ``name``.
    """
    path = Path(path)
    file = path / "model.safetensors" if path.is_dir() else path
    tensors, meta = ckpt.load_tensors(file, device=device)
    name = name or meta.get("model")
    if name is None:
        raise CheckpointError(f"{file} carries no kdcollapse metadata; give the model name (--model NAME)")
    if meta.get("model") and meta["model"] != name:
        raise CheckpointError(f"{file} holds a '{meta['model']}', not a '{name}'")
    if meta.get("num_classes") and meta["num_classes"] != dataset.num_classes:
        raise CheckpointError(
            f"{file} holds a {meta['num_classes']}-class model; dataset '{dataset.name}' has "
            f"{dataset.num_classes} classes"
        )
    options = {**meta.get("model_kwargs", {}), **(kwargs or {})}
    network = create_model(name, dataset.num_classes, in_channels=dataset.in_channels, **options).to(device)
    ckpt.load_state(network, tensors, str(file))
    check_inputs(network, dataset, name)
    return network, meta


def check_inputs(model: nn.Module, dataset, name: str) -> None:
    """Raise a clear error if ``model`` cannot take the dataset's inputs (tried on one sample)."""
    from kdcollapse.data import make_loader

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
