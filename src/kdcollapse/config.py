"""Typed run configuration: YAML files plus dotted ``key=value`` overrides.

A config is a tree of dataclasses. Values come from the dataclass defaults, then the YAML file, then
overrides such as ``optim.lr=0.1`` (values are parsed as YAML, so ``train.amp=bf16``,
``schedule.milestones=[30,60]`` and ``teacher.checkpoint=null`` all work). Unknown keys and values of the
wrong type raise :class:`~kdcollapse.errors.ConfigError` naming the key and the valid keys. The
``method:`` section is typed by the chosen method's own ``Config`` dataclass.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from kdcollapse.errors import ConfigError
from kdcollapse.methods import get_method


@dataclass
class DataConfig:
    name: str = "fashion_mnist"
    root: str | None = None  # None: search the default paths (see `kdcollapse data list`)
    batch_size: int = 128  # per process
    eval_batch_size: int = 512
    crop_padding: int = 0  # random crop with this zero padding (pixels); 0 disables
    flip: bool = False  # random horizontal flip
    classes: list[int] | None = None  # keep only these classes, relabelled 0..K'-1 in this order; None: all
    train_per_class: int | None = None  # balanced training subset (samples per class); None: all
    test_per_class: int | None = None
    num_workers: int = 4  # decoding processes, folder datasets only


@dataclass
class ModelConfig:
    name: str = "convnet"  # a registered model (`kdcollapse models`)
    num_classes: int | None = None  # None: the dataset's; if given, it must match the dataset
    kwargs: dict = field(default_factory=dict)  # extra arguments of the model factory, e.g. {input_size: 8}


@dataclass
class TeacherConfig:
    checkpoint: str | None = None  # run directory of `kdcollapse train` (uses its model.safetensors)
    model: str | None = None  # or: a registered model name ...
    weights: str | None = None  # ... plus a safetensors file of its weights
    cache: Literal["off", "logits"] = "off"  # logits: one teacher pass before training, then stored logits


@dataclass
class OptimConfig:
    lr: float = 0.05  # at the configured batch size; no automatic scaling
    momentum: float = 0.9
    nesterov: bool = False
    weight_decay: float = 5e-4  # on every parameter, as in the papers' official code
    grad_clip: float | None = None  # max global L2 norm of the gradient


@dataclass
class ScheduleConfig:
    name: Literal["multistep", "cosine", "constant"] = "multistep"
    milestones: list[int] = field(default_factory=lambda: [150, 180, 210])  # epochs (multistep)
    gamma: float = 0.1  # multistep factor
    warmup_epochs: float = 0.0  # linear warm-up from 0, per step
    min_lr: float = 0.0  # cosine floor


@dataclass
class TrainConfig:
    epochs: int = 240
    eval_every: int = 1  # epochs; the last epoch is always evaluated
    label_smoothing: float = 0.0
    amp: Literal["off", "bf16", "fp16"] = "off"  # autocast: bf16 on CPU or CUDA, fp16 on CUDA only
    channels_last: bool = True  # image batches, student and teacher in NHWC (faster on both CPU families measured)
    compile: bool = False  # torch.compile the student
    deterministic: bool = False  # torch.use_deterministic_algorithms
    device: str = "auto"  # auto | cpu | cuda | cuda:N
    progress: bool = True  # progress bar on the console
    tensorboard: bool = False  # also log to run_dir/tensorboard (needs the tensorboard package)


@dataclass
class AnalysisConfig:
    every: int = 0  # epochs between collapse-metric snapshots of train and test features; 0: off
    train_per_class: int | None = None  # subsample the training split for the snapshots

    def __post_init__(self) -> None:
        if self.every < 0 or (self.train_per_class is not None and self.train_per_class < 1):
            raise ConfigError(f"analysis.every must be >= 0 and analysis.train_per_class >= 1 or null, got "
                              f"{self.every} and {self.train_per_class}")


@dataclass
class RunConfig:
    run_dir: str = "runs/default"
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: Any = None  # the chosen method's Config dataclass, with its `name`
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Build a :class:`RunConfig` from an optional YAML file and ``key=value`` overrides."""
    data: dict = {}
    if path is not None:
        data = read_yaml(path)
    for item in overrides:
        _apply_override(data, item)
    return config_from_dict(data)


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"config file {path} is not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def config_from_dict(data: dict) -> RunConfig:
    data = dict(data)
    method = data.pop("method", None) or {}
    if not isinstance(method, dict):
        raise ConfigError("'method' must be a mapping with at least a 'name' key")
    cfg = _build(RunConfig, data, "")
    cfg.method = method_config(method)
    return cfg


def method_config(section: dict):
    """Type the ``method:`` section with the chosen method's ``Config`` dataclass."""
    section = dict(section)
    name = section.pop("name", "vanilla")
    config_cls = get_method(name).Config
    cfg = _build(config_cls, section, "method.")
    cfg.name = name  # every method config carries its name, for saving and printing
    return cfg


def config_to_dict(cfg) -> dict:
    """Plain dict (YAML-ready) of a config tree; the method section keeps its ``name`` first."""
    out = {}
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if dataclasses.is_dataclass(value):
            value = {"name": value.name, **config_to_dict(value)} if f.name == "method" else config_to_dict(value)
        out[f.name] = value
    return out


def save_config(cfg: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config_to_dict(cfg), sort_keys=False))


def _apply_override(data: dict, item: str) -> None:
    key, sep, raw = item.partition("=")
    if not sep or not key:
        raise ConfigError(f"override {item!r} must look like key=value (e.g. optim.lr=0.1)")
    try:
        value = yaml.safe_load(raw) if raw.strip() else None
    except yaml.YAMLError as err:
        raise ConfigError(f"cannot parse the value of override {item!r}: {err}") from None
    node = data
    parts = key.strip().split(".")
    for part in parts[:-1]:
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            raise ConfigError(f"override {item!r}: {part!r} is not a section")
        node = child
    node[parts[-1]] = value


def _build(cls, data: dict, prefix: str):
    if not isinstance(data, dict):
        raise ConfigError(f"'{prefix.rstrip('.') or 'config'}' must be a mapping, got {data!r}")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        where = f"section '{prefix.rstrip('.')}'" if prefix else "the config"
        valid = ", ".join(sorted(fields)) or "(none)"
        raise ConfigError(f"unknown key '{prefix}{unknown[0]}' in {where}. Valid keys: {valid}")
    kwargs = {name: _coerce(hints[name], value, prefix + name) for name, value in data.items()}
    return cls(**kwargs)


def _coerce(tp, value, key: str):
    """Check ``value`` against the annotation ``tp``; convert ints to floats and mappings to dataclasses."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        return _build(tp, value if value is not None else {}, key + ".")
    if origin in (typing.Union, types.UnionType):
        options = typing.get_args(tp)
        if value is None and type(None) in options:
            return None
        errors = []
        for option in options:
            if option is type(None):
                continue
            try:
                return _coerce(option, value, key)
            except ConfigError as err:
                errors.append(err)
        raise errors[0]
    if origin is Literal:
        choices = typing.get_args(tp)
        if isinstance(value, bool) and ("off" if value is False else "on") in choices:
            value = "off" if value is False else "on"  # YAML 1.1 reads `off`/`on` as booleans
        if value not in choices:
            raise ConfigError(f"'{key}' must be one of {', '.join(map(str, choices))}; got {value!r}")
        return value
    if tp is dict or origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"'{key}' must be a mapping, got {value!r}")
        return value
    if origin is list:
        (item_tp,) = typing.get_args(tp)
        if not isinstance(value, list):
            raise ConfigError(f"'{key}' must be a list, got {value!r}")
        return [_coerce(item_tp, v, f"{key}[{i}]") for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if tp is float and isinstance(value, str):  # PyYAML reads `5e-4` (no dot) as a string
        try:
            return float(value)
        except ValueError:
            pass
    if tp in (int, float, str, bool) and (type(value) is tp):
        return value
    raise ConfigError(f"'{key}' must be {getattr(tp, '__name__', tp)}, got {value!r} ({type(value).__name__})")
