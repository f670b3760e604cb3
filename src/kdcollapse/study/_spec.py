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
GROUP_KEYS = ("group", "run", "config", "step", "params", "grid", "choose", "seeds", "teacher", "overrides", "post",
              "resources")
CHOOSE_KEYS = ("group", "per", "by", "lowest")
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
    # the choices not made yet: (group, per-field values, the choice's source group, its runs not finished)
    waiting: tuple[tuple[str, dict, str, tuple[str, ...]], ...] = ()

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
    waiting = []
    for index, group in enumerate(groups):
        settings = None
        if isinstance(group, dict) and "choose" in group:  # its settings: the choices made on the runs so far
            settings, wait = _chosen(group, index, runs, path, data.get("summary"))
            waiting += wait
        for run in _expand(group, index, data.get("seeds", [0]), root, extra, settings):
            if run.name in runs:
                raise ConfigError(f"{path}: run {run.name!r} is named twice (group {run.group!r}); give each run "
                                  "its own name with the grid's fields, e.g. run: beta{beta}/seed{seed}")
            if run.teacher is not None and run.teacher not in runs:
                raise ConfigError(f"{path}: run {run.name!r} names teacher {run.teacher!r}, which is not a run of an "
                                  "earlier group")
            if run.teacher is not None:
                run = _with_teacher(run, runs[run.teacher])
            runs[run.name] = run
    return Study(path=path, name=name, runs_dir=root, runs=runs, summary=data.get("summary"), waiting=tuple(waiting))


def _known(data: dict, keys: tuple[str, ...], where: str) -> None:
    for key in data:
        if key not in keys:
            raise ConfigError(unknown_choice(f"key of {where}", key, keys))


def _expand(group: dict, index: int, seeds, root: Path, extra: tuple[str, ...] = (),
            settings: list[dict] | None = None) -> list[RunSpec]:
    """The runs of ``group``: its grid (``settings``: the values its ``choose`` resolved to instead) × seeds."""
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
    if settings is None:
        settings = []
        for combination in itertools.product(*grid.values()):
            values = {}
            for key, value in zip(grid, combination):
                values.update(value if isinstance(value, dict) else {key: value})  # a mapping sets several fields
            settings.append(values)
    runs = []
    for seed, setting in itertools.product(seeds, settings):
        values = {"seed": seed, **setting}
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


def _chosen(group: dict, index: int, runs: dict[str, RunSpec], path: Path,
            summary) -> tuple[list[dict], list[tuple[str, dict, str, tuple[str, ...]]]]:
    """The settings of a group with ``choose: {group: SOURCE, per: FIELDS, by: val_METRIC, lowest: false}``: for each
    value of the ``per`` fields among SOURCE's runs, the setting (its grid values) of the SOURCE run with the
    highest mean validation ``by`` over the seeds every candidate shares, each run read at its epoch selected by the
    summary's ``select`` (the last without one), the first on a tie: the rule of a summary section's ``choose``.
    A choice is made once every SOURCE run it reads is finished (its run directory, else its committed record in
    ``runs.json``); until then it is waiting (second value: group, per values, SOURCE, the runs not finished)."""
    from kdcollapse.study._summary import _choose, _validation_only

    label = str(group.get("group", f"groups[{index}]"))
    spec = group["choose"]
    if not isinstance(spec, dict) or set(spec) - set(CHOOSE_KEYS) or "group" not in spec:
        raise ConfigError(f"group {label!r}: 'choose' is {{group: an earlier group, per: its field(s), by: val_METRIC, "
                          f"lowest: false}}, got {spec!r}")
    if "grid" in group:
        raise ConfigError(f"group {label!r} takes its settings from 'choose'; it has no 'grid' of its own")
    select = summary.get("select", "val_acc") if isinstance(summary, dict) else "val_acc"
    by = spec.get("by", select)
    if by is None:
        raise ConfigError(f"group {label!r}: 'choose' needs 'by' (a validation metric): the summary selects no epoch")
    _validation_only(by, f"group {label!r} chooses its setting on")
    source = [r for r in runs.values() if r.group == spec["group"]]
    if not source:
        raise ConfigError(unknown_choice(f"group that group {label!r} chooses from (an earlier training group)",
                                         spec["group"], tuple(dict.fromkeys(r.group for r in runs.values()))))
    per = [spec["per"]] if isinstance(spec.get("per"), str) else list(spec.get("per") or [])
    for f in per:
        if any(f not in r.values for r in source) or f == "seed":
            raise ConfigError(f"group {label!r}: 'per: {f}' is not a grid field of group {spec['group']!r} "
                              f"(fields: {', '.join(k for k in source[0].values if k != 'seed')})")
    records_file = path.parent / "runs.json"
    records = json.loads(records_file.read_text()) if records_file.is_file() else {}
    at = "best" if select else "last"
    members: dict[tuple, list[RunSpec]] = {}
    for run in source:
        members.setdefault(tuple(_hashable(run.values[f]) for f in per), []).append(run)
    settings, waiting = [], []
    for key, group_runs in members.items():
        combos: list[dict] = []
        cells: dict[str, dict[int, dict]] = {}
        missing = []
        for run in group_runs:
            setting = {k: v for k, v in run.values.items() if k != "seed"}
            if setting not in combos:
                combos.append(setting)
            cell = cells.setdefault(str(combos.index(setting)), {})
            value = _validation_value(run, records.get(run.name), by, select)
            if value is _NOT_FINISHED:
                missing.append(run.name)
            elif value is not None:
                cell[run.values["seed"]] = {at: {by: value}}
        where = {f: group_runs[0].values[f] for f in per}
        if missing:
            waiting.append((label, where, spec["group"], tuple(missing)))
            continue
        chosen, _ = _choose(cells, {"among": "*", "by": by, "lowest": bool(spec.get("lowest", False))}, at)
        if chosen is None:  # every candidate diverged, or no seed is shared: nothing to choose from
            waiting.append((label, where, spec["group"], ()))
            continue
        settings.append(combos[int(chosen)])
    return settings, waiting


_NOT_FINISHED = object()


def _hashable(value):
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value


def _validation_value(run: RunSpec, record: dict | None, by: str, select: str | None):
    """``by`` of a finished run at its selected epoch (its run directory, else its committed ``record``); None for a
    diverged run or one without the metric; ``_NOT_FINISHED`` otherwise."""
    from kdcollapse.runs import read_committed_metrics
    from kdcollapse.study._execute import state_of

    state = state_of(run) if run.run_dir.is_dir() else "new"
    if state == "diverged":
        return None
    if state == "finished":
        rows = read_committed_metrics(run.run_dir)
        if select:
            row = max((r for r in rows if select in r), key=lambda r: r[select], default=None)  # the first highest
        else:
            row = rows[-1] if rows else None
        return None if row is None else row.get(by)
    if record is not None:
        if "diverged" in record:
            return None
        return (record.get("best" if select else "last") or {}).get(by)
    return _NOT_FINISHED
