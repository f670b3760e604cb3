"""Typed run configuration: YAML files plus dotted ``key=value`` overrides.

A config is a tree of dataclasses. Values come from the dataclass defaults, then the YAML file, then
overrides such as ``optim.lr=0.1`` (values are parsed as YAML, so ``train.amp=bf16``,
``schedule.milestones=[30,60]`` and ``teacher.checkpoint=null`` all work). Unknown keys, values of the
wrong type and values outside a field's valid range raise :class:`~kdcollapse.errors.ConfigError` naming
the key, the value and what is valid. Each field declares its range next to it (``valid(default,
rule)``); ranges that relate two fields are in ``_RELATIONS``. The ``method:`` section is typed (and
checked) by the chosen method's own ``Config`` dataclass.
"""

from __future__ import annotations

import copy
import dataclasses
import itertools
import math
import re
import sys
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from kdcollapse._registry import import_modules
from kdcollapse._yaml import load_yaml
from kdcollapse.errors import ConfigError, KdcollapseError, unknown_choice
from kdcollapse.data import USER_DATA, list_datasets
from kdcollapse.methods import get_method, list_methods
from kdcollapse.models import list_models

# --- valid ranges -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    """The valid values of a field beyond its type: ``test(value)`` and ``text``, the range in words
    (a callable for ranges known only at run time); ``explain(value)``, if given, words the error."""

    text: str | Callable[[], str]
    test: Callable[[Any], bool]
    explain: Callable[[Any], str] | None = None

    def describe(self) -> str:
        return self.text() if callable(self.text) else self.text


def interval(low: float | None = None, high: float | None = None, *, open_low: bool = False,
             open_high: bool = False) -> Rule:
    """A finite number in ``[low, high]``; ``open_*`` excludes that end, ``None`` leaves it unbounded."""
    if high is None:
        text = f"{'>' if open_low else '>='} {low}"
    elif low is None:
        text = f"{'<' if open_high else '<='} {high}"
    else:
        text = f"in {'(' if open_low else '['}{low}, {high}{')' if open_high else ']'}"

    def test(v) -> bool:
        above = low is None or (v > low if open_low else v >= low)
        below = high is None or (v < high if open_high else v <= high)
        return math.isfinite(v) and above and below

    return Rule(text, test)


def each(rule: Rule, order: Literal["distinct", "increasing"]) -> Rule:
    """A list whose items all satisfy ``rule`` and are distinct, or strictly increasing."""
    ordered = {"distinct": lambda v: len(set(v)) == len(v),
               "increasing": lambda v: all(a < b for a, b in itertools.pairwise(v))}[order]
    words = {"distinct": "distinct", "increasing": "strictly increasing"}[order]
    return Rule(f"a list of numbers {rule.describe()}, {words}", lambda v: all(map(rule.test, v)) and ordered(v))


def registered(kind: str, also: tuple[str, ...] = ()) -> Rule:
    """A name in a registry (``kind``: ``dataset`` or ``model``), looked up when first checked, or one of
    ``also`` (names with another meaning, valid but not advertised)."""

    def names() -> list[str]:
        return sorted(list_datasets() if kind == "dataset" else list_models())

    return Rule(lambda: f"a registered {kind}: {', '.join(names())}", lambda v: v in names() or v in also,
                lambda v: unknown_choice(kind, v, names()))


_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
AT_LEAST_1, AT_LEAST_0 = interval(1), interval(0)
NON_EMPTY = Rule("a non-empty string", lambda v: len(v) > 0)


def valid(default: Any = dataclasses.MISSING, rule: Rule | None = None, *, factory: Any = dataclasses.MISSING):
    """A dataclass field with its valid range (``None`` values of optional fields are not checked)."""
    return field(default=default, default_factory=factory, metadata={"valid": rule})


@dataclass
class DataConfig:
    # a registered dataset, or "user": data passed from Python (fit(cfg, train_data=..., test_data=...))
    name: str = valid("fashion_mnist", registered("dataset", also=(USER_DATA,)))
    root: str | None = valid(None, NON_EMPTY)  # None: search the default paths (see `kdcollapse data list`)
    batch_size: int = valid(128, AT_LEAST_1)  # per process
    eval_batch_size: int = valid(512, AT_LEAST_1)
    crop_padding: int = valid(0, AT_LEAST_0)  # random crop with this zero padding (pixels); 0 disables
    flip: bool = False  # random horizontal flip
    # keep only these classes, relabelled 0..K'-1 in this order; None: all
    classes: list[int] | None = valid(None, Rule("a non-empty list of distinct class indices >= 0",
                                                 lambda v: len(v) > 0 and each(AT_LEAST_0, "distinct").test(v)))
    train_per_class: int | None = valid(None, AT_LEAST_1)  # balanced training subset (samples per class); None: all
    test_per_class: int | None = valid(None, AT_LEAST_1)  # None: all
    # validation samples per class, carved from the training split; 0: none
    val_per_class: int = valid(0, AT_LEAST_0)
    num_workers: int = valid(4, AT_LEAST_0)  # decoding processes, folder datasets only; 0: in the main process


@dataclass
class ModelConfig:
    name: str = valid("convnet", registered("model"))  # a registered model (`kdcollapse models`)
    num_classes: int | None = valid(None, AT_LEAST_1)  # None: the dataset's; if given, it must match the dataset
    # extra arguments of the model factory, e.g. {input_size: 8}
    kwargs: dict = valid(rule=Rule("a mapping with string keys", lambda v: all(isinstance(k, str) for k in v)),
                         factory=dict)


@dataclass
class TeacherConfig:
    checkpoint: str | None = valid(None, NON_EMPTY)  # run directory of `kdcollapse train` (its model.safetensors)
    model: str | None = valid(None, registered("model"))  # or: a registered model name ...
    weights: str | None = valid(None, NON_EMPTY)  # ... plus a safetensors file of its weights
    cache: Literal["off", "logits"] = "off"  # logits: one teacher pass before training, then stored logits
    cache_topk: int | None = valid(None, AT_LEAST_1)  # store only each image's k largest logits (KD, DKD)


def torch_class(kind: Literal["optimizer", "scheduler"], name: str) -> type | None:
    """The ``torch.optim`` optimizer or ``torch.optim.lr_scheduler`` schedule called ``name`` (any case),
    ``None`` if there is none. Schedules that need a metric or callables (ReduceLROnPlateau, LambdaLR, ...)
    cannot be configured by name and are left out."""
    return _torch_classes(kind).get(name.lower())


def _torch_classes(kind: str) -> dict[str, type]:
    import torch

    module, base = ((torch.optim, torch.optim.Optimizer) if kind == "optimizer"
                    else (torch.optim.lr_scheduler, torch.optim.lr_scheduler.LRScheduler))
    left_out = {"lrscheduler", "lambdalr", "multiplicativelr", "sequentiallr", "chainedscheduler",
                "reducelronplateau"}
    return {name.lower(): cls for name, cls in vars(module).items()
            if isinstance(cls, type) and issubclass(cls, base) and cls is not base and name.lower() not in left_out}


def _torch_names(kind: str) -> Rule:
    builtin = ("multistep", "cosine", "constant") if kind == "scheduler" else ()

    def names() -> list[str]:
        return [*builtin, *sorted(cls.__name__ for cls in _torch_classes(kind).values())]

    return Rule(lambda: ", ".join(names()), lambda v: v in builtin or torch_class(kind, v) is not None,
                lambda v: unknown_choice(f"torch.optim {kind}" if not builtin else "schedule", v, names()))


@dataclass
class OptimConfig:
    name: str = valid("sgd", _torch_names("optimizer"))  # sgd, adamw, or any torch.optim optimizer (any case)
    lr: float = valid(0.05, AT_LEAST_0)  # at the configured batch size; no automatic scaling; 0 freezes the weights
    momentum: float = valid(0.9, interval(0, 1, open_high=True))  # SGD only (Adam-type: kwargs.betas)
    nesterov: bool = False  # SGD only; needs momentum > 0
    weight_decay: float = valid(5e-4, AT_LEAST_0)  # on every parameter, as in the papers' official code
    grad_clip: float | None = valid(None, interval(0, open_low=True))  # max global L2 norm of the gradient
    kwargs: dict = valid(rule=Rule("a mapping with string keys", lambda v: all(isinstance(k, str) for k in v)),
                         factory=dict)  # further arguments of the optimizer, e.g. {betas: [0.9, 0.95], eps: 1e-8}
    accumulate: int = valid(1, AT_LEAST_1)  # batches whose gradients are summed into one optimizer step


@dataclass
class ScheduleConfig:
    # multistep, cosine, constant (per optimizer step, with warm-up), or a torch.optim.lr_scheduler name
    name: str = valid("multistep", _torch_names("scheduler"))
    # epochs (multistep)
    milestones: list[int] = valid(rule=each(AT_LEAST_1, "increasing"), factory=lambda: [150, 180, 210])
    gamma: float = valid(0.1, interval(0, 1, open_low=True))  # multistep factor
    warmup_epochs: float = valid(0.0, AT_LEAST_0)  # linear warm-up from 0, per step
    min_lr: float = valid(0.0, AT_LEAST_0)  # cosine floor, <= optim.lr
    # torch schedules only: their arguments (T_max, total_iters, total_steps and max_lr default to the run's
    # length and optim.lr) and whether they step after every epoch or every optimizer step
    kwargs: dict = valid(rule=Rule("a mapping with string keys", lambda v: all(isinstance(k, str) for k in v)),
                         factory=dict)
    interval: Literal["epoch", "step"] = "epoch"


@dataclass
class TrainConfig:
    epochs: int = valid(240, AT_LEAST_1)
    eval_every: int = valid(1, AT_LEAST_1)  # epochs; the last epoch is always evaluated
    label_smoothing: float = valid(0.0, interval(0, 1, open_high=True))
    # autocast: bf16 on CPU or CUDA, fp16 on CUDA only; auto: bf16 where the device computes it natively
    # (CPU with avx512_bf16 or AMX, GPU with bf16), else float32
    amp: Literal["off", "auto", "bf16", "fp16"] = "off"
    channels_last: bool = True  # image batches, student and teacher in NHWC (faster on both CPU families measured)
    compile: bool = False  # torch.compile the student
    deterministic: bool = False  # torch.use_deterministic_algorithms
    device: str = valid("auto", Rule("auto, cpu, cuda, cuda:N or mps", lambda v: bool(_DEVICE.fullmatch(v))))
    progress: bool = True  # progress bar on the console
    log_every: int = valid(10, AT_LEAST_1)  # optimizer steps between the per-step scalars (steps.jsonl, trackers)
    tensorboard: bool = False  # also log to run_dir/tensorboard (needs the tensorboard package)
    trackers: list[str] = valid(rule=Rule("a list of wandb, mlflow", lambda v: all(t in ("wandb", "mlflow") for t in v)),
                                factory=list)  # also log to W&B / MLflow (when installed); see runs/_tracking.py
    group: str = ""  # the trackers' group of this run (a study's name, set by `kdcollapse study`)
    ema: float = valid(0.0, interval(0, 1, open_high=True))  # weight-average decay per optimizer step; 0: off


@dataclass
class AnalysisConfig:
    every: int = valid(0, AT_LEAST_0)  # epochs between collapse-metric snapshots of train and test features; 0: off
    train_per_class: int | None = valid(None, AT_LEAST_1)  # subsample the training split for the snapshots


@dataclass
class RunConfig:
    imports: list[str] = valid(rule=Rule("a list of non-empty module names", lambda v: all(isinstance(m, str) and m for m in v)),
                               factory=list)  # user modules imported first (their registrations)
    run_dir: str = valid("runs/default", NON_EMPTY)
    seed: int = valid(0, Rule("in [0, 2**64 - 1] (64 bits)", interval(0, 2**64 - 1).test))
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    method: Any = None  # the chosen method's Config dataclass, with its `name` (checked by that dataclass)
    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    analysis: AnalysisConfig = field(default_factory=AnalysisConfig)


# Ranges that relate two fields: (keys, holds(cfg), what must hold).
_RELATIONS = (
    (("schedule.min_lr", "optim.lr"), lambda c: c.schedule.min_lr <= c.optim.lr, "schedule.min_lr <= optim.lr"),
    (("optim.nesterov", "optim.momentum"), lambda c: not c.optim.nesterov or c.optim.momentum > 0,
     "optim.momentum > 0 when optim.nesterov is true"),
    (("optim.name", "optim.momentum", "optim.nesterov"),
     lambda c: c.optim.name.lower() == "sgd" or (c.optim.momentum == 0.9 and not c.optim.nesterov),
     "optim.momentum and optim.nesterov only with optim.name=sgd (Adam-type optimizers: optim.kwargs.betas)"),
    (("teacher.cache_topk", "teacher.cache"), lambda c: c.teacher.cache_topk is None or c.teacher.cache == "logits",
     "teacher.cache=logits when teacher.cache_topk is set"),
    (("schedule.name", "schedule.warmup_epochs"),
     lambda c: c.schedule.name in ("multistep", "cosine", "constant") or c.schedule.warmup_epochs == 0,
     "schedule.warmup_epochs = 0 with a torch schedule (warm-up belongs to multistep, cosine and constant)"),
)


def check_config(cfg: RunConfig) -> RunConfig:
    """Raise :class:`ConfigError` for the first field (or pair of fields) outside its valid range."""
    _check_fields(cfg, "")
    for keys, holds, what in _RELATIONS:
        if not holds(cfg):
            values = ", ".join(f"{k}={_lookup(cfg, k)!r}" for k in keys)
            raise ConfigError(f"{values}: need {what}")
    return cfg


def _check_fields(node, prefix: str) -> None:
    for f in dataclasses.fields(node):
        value, key = getattr(node, f.name), prefix + f.name
        if f.name != "method" and dataclasses.is_dataclass(value):
            _check_fields(value, key + ".")
        rule = f.metadata.get("valid")
        if rule is None or value is None or rule.test(value):
            continue
        if rule.explain is not None:
            raise ConfigError(f"{key}: {rule.explain(value)}")
        null = " or null" if _optional(node, f.name) else ""
        raise ConfigError(f"{key} must be {rule.describe()}{null}, got {value!r}")


def _optional(node, name: str) -> bool:
    return type(None) in typing.get_args(typing.get_type_hints(type(node))[name])


def _lookup(cfg, key: str):
    for part in key.split("."):
        cfg = getattr(cfg, part)
    return cfg


def load_config(path: str | Path | None = None, overrides: list[str] | tuple[str, ...] = (), *,
                saved: bool = False) -> RunConfig:
    """Build a :class:`RunConfig` from an optional YAML file and ``key=value`` overrides. ``saved=True``: the
    file is a run's saved config (data): its ``imports:`` must already be imported (``--import``), never are."""
    data: dict = {}
    if path is not None:
        data = read_yaml(path)
    for item in overrides:
        _apply_override(data, item)
    return config_from_dict(data, saved_in=path if saved else None)


def read_yaml(path: str | Path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file not found: {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except OSError as err:
        raise ConfigError(f"config file {path}: cannot read ({err.strerror})") from None
    except UnicodeDecodeError as err:
        raise ConfigError(f"config file {path} is not UTF-8 text (invalid byte at offset {err.start})") from None
    data = load_yaml(text, f"config file {path}")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


def config_from_dict(data: dict, saved_in: str | Path | None = None) -> RunConfig:
    data = dict(data)
    import_user_modules(data.get("imports"), saved_in)
    method = data.pop("method", None) or {}
    if not isinstance(method, dict):
        raise ConfigError("'method' must be a mapping with at least a 'name' key")
    cfg = _build(RunConfig, data, "")
    cfg.method = method_config(method)
    return check_config(cfg)


def import_user_modules(imports, saved_in: str | Path | None = None) -> None:
    """Import the config's ``imports:`` (a list of module names) before anything is looked up by name; for a
    config ``saved_in`` a run directory, refuse those not imported already: reading a run never runs code."""
    if imports is None:
        return
    if not isinstance(imports, list):
        raise ConfigError(f"'imports' must be a list of module names, got {imports!r}")
    if saved_in is not None:
        missing = [m for m in imports if not isinstance(m, str) or m not in sys.modules]
        if missing:
            flags = " ".join(f"--import {m}" for m in missing)
            raise ConfigError(f"{saved_in} lists imports: {missing}, and reading a run directory never imports "
                              f"code: pass {flags} (or import it first) if you trust the module")
        return
    try:
        import_modules(imports, "imports")
    except ConfigError:
        raise
    except KdcollapseError as err:
        raise ConfigError(str(err)) from None


def method_config(section: dict):
    """Type the ``method:`` section with the chosen method's ``Config`` dataclass."""
    section = dict(section)
    name = section.pop("name", "vanilla")
    config_cls = get_method(name).Config
    if "logit_standardization" in section and not _has_field(config_cls, "logit_standardization"):
        takes = [m for m in list_methods() if _has_field(get_method(m).Config, "logit_standardization")]
        raise ConfigError(f"method.logit_standardization is defined for {', '.join(takes)} (the methods its "
                          f"authors apply it to), not for method '{name}'; see docs/distillation.md")
    cfg = _build(config_cls, section, "method.")
    cfg.name = name  # every method config carries its name, for saving and printing
    return cfg


def _has_field(config_cls, name: str) -> bool:
    return any(f.name == name for f in dataclasses.fields(config_cls))


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
    value = load_yaml(raw, f"the value of override {item!r}") if raw.strip() else None
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


def build_section(cls, data: dict, overrides: list[str] | tuple[str, ...] = ()):
    """A typed config of dataclass ``cls`` from ``data`` (e.g. :func:`read_yaml`) and ``key=value``
    overrides, with the same checks as the run config: unknown keys and mistyped values are errors."""
    data = dict(data)
    for item in overrides:
        name = item.partition("=")[0].strip().split(".")[0]
        if "." in item.partition("=")[0] and name not in data:  # a dotted key into a mapping with a default
            data[name] = _default_mapping(cls, name)  # (e.g. student.hidden_size=128): changes that key only
        _apply_override(data, item)
    return _build(cls, data, "")


def _default_mapping(cls, name: str) -> dict:
    """A copy of the default of ``cls``'s mapping field ``name`` (a plain ``dict`` field), so that a dotted
    override merges into it; ``{}`` for any other field (a dataclass section takes its defaults in ``_build``)."""
    spec = next((f for f in dataclasses.fields(cls) if f.name == name and f.init), None)
    if spec is None or spec.default_factory is dataclasses.MISSING:
        return {}
    default = spec.default_factory()
    return copy.deepcopy(default) if isinstance(default, dict) else {}
