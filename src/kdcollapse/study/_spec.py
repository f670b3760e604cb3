"""The study file: a YAML list of run groups (a config, overrides, a grid × seeds, a teacher), the post-run
steps and the summary, expanded into the runs it names. See docs/studies.md for the format."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import yaml

from kdcollapse.errors import ConfigError, unknown_choice
from kdcollapse.study._steps import RUN_STEPS, STEPS

STUDY_KEYS = ("name", "runs_dir", "seeds", "define", "groups", "summary", "tracking")
GROUP_KEYS = ("group", "run", "config", "step", "params", "grid", "seeds", "teacher", "overrides", "post", "resources")
RESOURCE_KEYS = ("cpus", "gpus", "tasks", "mem_gb", "minutes", "partition", "threads")
_FIELD = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class PostStep:
    """A step on a finished (or diverged) run, done once ``creates`` exists in the run directory (and, with
    ``key``, holds that top-level JSON key: several evaluations may add to one file): the command
    ``kdcollapse COMMAND RUN_DIR ARGS``, or the registered step ``step`` (``kdcollapse.study._steps.STEPS``)."""

    command: str | None
    args: tuple[str, ...]
    creates: str
    step: str | None = None
    key: str | None = None

    def done(self, run_dir: Path) -> bool:
        path = Path(run_dir) / self.creates
        if not path.is_file():
            return False
        if self.key is None:
            return True
        try:
            return self.key in json.loads(path.read_text())
        except ValueError:
            return False  # torn or not JSON: run the step again


@dataclass(frozen=True)
class RunSpec:
    """One run of a study: its name (its path under the study's ``runs_dir``), the config and overrides it
    trains with (``run_dir``, ``seed`` and ``teacher.checkpoint`` included), and the grid values it stands for."""

    name: str
    group: str
    config: str
    overrides: tuple[str, ...]
    values: dict
    run_dir: Path
    teacher: str | None = None
    teacher_dir: Path | None = None
    post: tuple[PostStep, ...] = ()
    resources: dict = field(default_factory=dict)
    step: str | None = None  # a registered computation (kdcollapse.study._steps.RUN_STEPS) instead of training
    params: dict = field(default_factory=dict)  # its keyword arguments


@dataclass(frozen=True)
class Study:
    """A loaded study file: its runs in file order (teachers first by construction: a teacher must be named
    before the runs that read it) and its summary spec (checked by :mod:`kdcollapse.study._summary`)."""

    path: Path
    name: str
    runs_dir: Path
    runs: dict[str, RunSpec]
    summary: dict | None

    def dependencies(self, run: RunSpec) -> list[RunSpec]:
        return [self.runs[run.teacher]] if run.teacher else []


def load_study(path: str | Path, runs_dir: str | Path | None = None) -> Study:
    """Read and expand a study file; ``runs_dir`` replaces the file's own (relative paths: to the current
    directory). Every problem is a ``ConfigError`` naming the group and the key."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"no study file {str(path)!r}")
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path} is not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a study file is a mapping with keys {', '.join(STUDY_KEYS)}")
    _known(data, STUDY_KEYS, f"{path}")
    name = str(data.get("name") or path.parent.name)
    root = Path(runs_dir if runs_dir is not None else data.get("runs_dir", f"runs/{name}"))
    groups = data.get("groups")
    if not isinstance(groups, list) or not groups:
        raise ConfigError(f"{path}: 'groups' must be a non-empty list of run groups")
    tracking = data.get("tracking") or []
    if not isinstance(tracking, list) or set(tracking) - {"wandb", "mlflow"}:
        raise ConfigError(f"{path}: 'tracking' is a list of wandb, mlflow; got {tracking!r}")
    extra = (f"train.trackers=[{', '.join(tracking)}]", f"train.group={name}") if tracking else ()
    runs: dict[str, RunSpec] = {}
    for index, group in enumerate(groups):
        for run in _expand(group, index, data.get("seeds", [0]), root, extra):
            if run.name in runs:
                raise ConfigError(f"{path}: run {run.name!r} is named twice (group {run.group!r}); give each run "
                                  "its own name with the grid's fields, e.g. run: beta{beta}/seed{seed}")
            if run.teacher is not None and run.teacher not in runs:
                raise ConfigError(f"{path}: run {run.name!r} names teacher {run.teacher!r}, which is not a run of an "
                                  "earlier group")
            if run.teacher is not None:
                run = _with_teacher(run, runs[run.teacher])
            runs[run.name] = run
    return Study(path=path, name=name, runs_dir=root, runs=runs, summary=data.get("summary"))


def _known(data: dict, keys: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in keys:
            raise ConfigError(unknown_choice(f"key of {where}", key, keys))


def _expand(group: dict, index: int, seeds, root: Path, extra: tuple[str, ...] = ()) -> list[RunSpec]:
    if not isinstance(group, dict):
        raise ConfigError(f"groups[{index}] must be a mapping with keys {', '.join(GROUP_KEYS)}")
    label = str(group.get("group", f"groups[{index}]"))
    _known(group, GROUP_KEYS, f"group {label!r}")
    if "run" not in group or ("config" in group) == ("step" in group):
        raise ConfigError(f"group {label!r} needs 'run' and one of 'config' (a training run) or 'step' (a registered "
                          f"computation: {', '.join(RUN_STEPS)})")
    if "step" in group:
        _step_group(group, label)
    resources = dict(group.get("resources") or {})
    _known(resources, RESOURCE_KEYS, f"resources of group {label!r}")
    post = tuple(_post_step(step, label) for step in _flat(group.get("post") or []))  # a nested list: spliced in
    grid = group.get("grid") or {}
    if not isinstance(grid, dict) or not all(isinstance(v, list) and v for v in grid.values()):
        raise ConfigError(f"group {label!r}: 'grid' maps each field to a non-empty list of values")
    seeds = group.get("seeds", seeds)
    if not isinstance(seeds, list) or not all(isinstance(s, int) for s in seeds):
        raise ConfigError(f"group {label!r}: 'seeds' must be a list of integers, got {seeds!r}")
    runs = []
    for seed, combination in itertools.product(seeds, itertools.product(*grid.values())):
        values = {"seed": seed}
        for key, value in zip(grid, combination):
            values.update(value if isinstance(value, dict) else {key: value})  # a mapping sets several fields
        name = _fill(group["run"], values, label)
        overrides = tuple(_fill(str(o), values, label) for o in _flat(_splice(group.get("overrides") or [], values)))
        if "step" in group:
            runs.append(RunSpec(name=name, group=label, config="", overrides=(), values=values, run_dir=root / name,
                                resources=resources, step=group["step"],
                                params={k: _value(v, values, label) for k, v in (group.get("params") or {}).items()}))
            continue
        runs.append(RunSpec(
            name=name, group=label, config=_fill(group["config"], values, label),
            overrides=(*overrides, *extra, f"seed={seed}", f"run_dir={root / name}"), values=values,
            run_dir=root / name, teacher=_fill(group["teacher"], values, label) if group.get("teacher") else None,
            post=tuple(_placed(step, root / name, root) for step in post), resources=resources))
    return runs


def _step_group(group: dict, label: str) -> None:
    if group["step"] not in RUN_STEPS:
        raise ConfigError(unknown_choice(f"step of group {label!r}", group["step"], tuple(RUN_STEPS)))
    for key in ("teacher", "overrides", "post"):
        if key in group:
            raise ConfigError(f"group {label!r} runs step {group['step']!r}, which takes 'params', not {key!r}")
    if not isinstance(group.get("params", {}), dict):
        raise ConfigError(f"group {label!r}: 'params' maps the step's keyword arguments to values")


def _value(value, values: dict, group: str):
    """A step parameter: ``"{field}"`` is that field's value as it is (a number stays a number); other strings
    have their fields filled in."""
    if isinstance(value, str) and (m := _FIELD.fullmatch(value)) and m.group(1) in values:
        return values[m.group(1)]
    return _fill(value, values, group) if isinstance(value, str) else value


def _splice(items: list, values: dict) -> list:
    """An override that is exactly ``{field}`` where the field's value is a list stands for that list."""
    return [values[m.group(1)] if isinstance(item, str) and (m := _FIELD.fullmatch(item))
            and isinstance(values.get(m.group(1)), list) else item for item in items]


def _flat(items: list) -> list:
    """Overrides with nested lists (a YAML alias of a shared list) spliced in."""
    return [x for item in items for x in (_flat(item) if isinstance(item, list) else [item])]


def _fill(template: str, values: dict, group: str) -> str:
    missing = sorted(set(_FIELD.findall(str(template))) - set(values))
    if missing:
        raise ConfigError(f"group {group!r}: {template!r} uses {', '.join(missing)}, not a field of its grid "
                          f"(fields: {', '.join(values)})")
    return _FIELD.sub(lambda m: str(values[m.group(1)]), str(template))


def _post_step(step, group: str) -> PostStep:
    if (not isinstance(step, dict) or set(step) - {"command", "step", "args", "creates", "key"} or "creates" not in step
            or ("command" in step) == ("step" in step) or ("step" in step and "args" in step)):
        raise ConfigError(f"group {group!r}: a post step is {{command: analyze | robust-eval, args: [...], creates: "
                          f"FILE, key: JSON_KEY}} or {{step: {' | '.join(STEPS)}, creates: FILE.json}}, got {step!r}")
    if "step" in step:
        if step["step"] not in STEPS:
            raise ConfigError(unknown_choice(f"post step of group {group!r}", step["step"], tuple(STEPS)))
        if not str(step["creates"]).endswith(".json"):
            raise ConfigError(f"group {group!r}: post step {step['step']!r} writes JSON; 'creates' must end in .json, "
                              f"got {step['creates']!r}")
        return PostStep(None, (), str(step["creates"]), step=str(step["step"]))
    if step["command"] not in ("analyze", "robust-eval"):
        raise ConfigError(unknown_choice(f"post command of group {group!r}", step["command"], ("analyze", "robust-eval")))
    return PostStep(str(step["command"]), tuple(str(a) for a in step.get("args") or []), str(step["creates"]),
                    key=str(step["key"]) if "key" in step else None)


def _placed(step: PostStep, run_dir: Path, runs_dir: Path) -> PostStep:
    """``step`` with ``{run_dir}`` (this run's directory) and ``{runs_dir}`` (the study's) filled into its
    arguments, e.g. ``--out {run_dir}/analysis_test_500`` or ``--teacher {runs_dir}/teacher``."""
    args = tuple(a.replace("{run_dir}", str(run_dir)).replace("{runs_dir}", str(runs_dir)) for a in step.args)
    return replace(step, args=args) if args != step.args else step


def _with_teacher(run: RunSpec, teacher: RunSpec) -> RunSpec:
    return replace(run, overrides=(*run.overrides, f"teacher.checkpoint={teacher.run_dir}"),
                   teacher_dir=teacher.run_dir)
