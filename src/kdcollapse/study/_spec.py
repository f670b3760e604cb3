"""The study file: a YAML list of run groups (a config, overrides, a grid × seeds, a teacher), the post-run
steps and the summary, expanded into the runs it names. See docs/studies.md for the format."""

from __future__ import annotations

import itertools
import json
import re
from dataclasses import dataclass, replace
from pathlib import Path, PurePosixPath

from kdcollapse._yaml import load_yaml
from kdcollapse.errors import ConfigError, unknown_choice
from kdcollapse.recipes import config_file
from kdcollapse.study._choice import chosen_settings, validation_only
from kdcollapse.study._runs import PostStep, RunSpec, committed_records, run_config
from kdcollapse.study._steps import RUN_STEPS, STEPS, check_run_step
from kdcollapse.study._summary_spec import check_cells, check_summary, flat

STUDY_KEYS = ("name", "runs_dir", "seeds", "define", "groups", "summary", "tracking")
GROUP_KEYS = ("group", "run", "config", "step", "params", "grid", "choose", "seeds", "teacher", "overrides", "post",
              "resources")
CHOOSE_KEYS = ("group", "per", "by", "lowest")
RESOURCE_KEYS = ("cpus", "gpus", "tasks", "mem_gb", "minutes", "partition", "threads")
_FIELD = re.compile(r"\{(\w+)\}")


@dataclass(frozen=True)
class Study:
    """A loaded study file: its runs in file order (teachers first by construction: a teacher must be named
    before the runs that read it) and its summary spec (checked when the file is read:
    :func:`kdcollapse.study._summary_spec.check_summary`)."""

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
    data = load_yaml(path.read_text(), str(path))  # a key given twice or nested too deep: one line
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
    waiting, fields, checked = [], {}, []
    for index, group in enumerate(groups):
        settings = candidates = None
        if isinstance(group, dict) and "choose" in group:  # its settings: the choices made on the runs so far
            settings, wait, candidates = _chosen(group, index, runs, path, data.get("summary"))
            waiting += wait
        expanded = _expand(group, index, data.get("seeds", [0]), root, extra, settings)
        label = str(group.get("group", f"groups[{index}]"))
        for run in expanded:
            if run.name in runs:
                raise ConfigError(f"{path}: run {run.name!r} is named twice (group {run.group!r}); give each run "
                                  "its own name with the grid's fields, e.g. run: beta{beta}/seed{seed}")
            if run.teacher is not None and run.teacher not in runs:
                raise ConfigError(f"{path}: run {run.name!r} names teacher {run.teacher!r}, which is not a run of an "
                                  "earlier group")
            if run.teacher is not None:
                run = _with_teacher(run, runs[run.teacher])
            runs[run.name] = run
        if candidates is not None:  # every setting the choice may take is checked now, before any run starts
            expanded = [_with_teacher(r, runs[r.teacher]) if r.teacher in runs else r
                        for r in _expand(group, index, data.get("seeds", [0]), root, extra, candidates)]
        else:
            expanded = [runs[r.name] for r in expanded]
        fields.setdefault(label, set()).update(k for r in expanded for k in r.values)
        checked += expanded
    if data.get("summary") is not None:
        check_cells(check_summary(data.get("summary")), fields)
    _check_runs(path, checked)
    return Study(path=path, name=name, runs_dir=root, runs=runs, summary=data.get("summary"), waiting=tuple(waiting))


def _check_runs(path: Path, runs: list[RunSpec]) -> None:
    """Read every run's config as it would train (:func:`kdcollapse.study._runs.run_config`; a run step's
    parameters by :func:`kdcollapse.study._steps.check_run_step`) without training or opening anything, so that a
    bad override of any group, a student's included, is refused before the first run starts. Runs that differ only
    in their seed, run directory and teacher directory (set by the study; any value of them is valid) are read
    once."""
    seen, files = set(), {}
    for run in runs:
        key = (run.config, run.step, json.dumps(run.params, sort_keys=True, default=str),
               tuple(o for o in run.overrides if not o.startswith(("seed=", "run_dir=", "teacher.checkpoint="))))
        if key in seen:
            continue
        seen.add(key)
        try:
            if run.step is not None:
                check_run_step(run.step, run.values["seed"], run.run_dir, run.params)
            else:
                if run.config not in files:  # a recipe name is looked up once
                    files[run.config] = config_file(run.config)
                run_config(run, files[run.config])
        except ConfigError as err:
            raise ConfigError(f"{path}: group {run.group!r}, run {run.name!r}: {err}") from None


def _inside(relative: str, what: str) -> str:
    """``relative`` once it is a relative path that stays inside its folder (no ``..``, not absolute, not empty)."""
    path = PurePosixPath(str(relative))
    if not str(relative).strip() or path.is_absolute() or ".." in path.parts or "\\" in str(relative) \
            or path.parts in ((), (".",)):
        raise ConfigError(f"{what} {str(relative)!r} must be a relative path inside its folder (no '..', not "
                          "absolute, not empty), e.g. 'kd/beta{beta}/seed{seed}'")
    return str(relative)


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
    post = tuple(_post_step(step, label) for step in flat(group.get("post") or []))  # a nested list: spliced in
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
        name = _inside(_fill(group["run"], values, label), f"group {label!r}: run name")
        overrides = tuple(_fill(str(o), values, label) for o in flat(_splice(group.get("overrides") or [], values)))
        if "step" in group:
            runs.append(RunSpec(name=name, group=label, config="", overrides=(), values=values, run_dir=root / name,
                                resources=resources, step=group["step"], post=post,
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
    for key in ("teacher", "overrides"):
        if key in group:
            raise ConfigError(f"group {label!r} runs step {group['step']!r}, which takes 'params', not {key!r}")
    if any(not isinstance(step, dict) or "step" not in step for step in flat(group.get("post") or [])):
        raise ConfigError(f"group {label!r} runs step {group['step']!r}: its post steps are registered steps "
                          f"({{step: NAME, creates: FILE.json}}), not commands")
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
    _inside(step["creates"], f"group {group!r}: post step 'creates'")
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
            summary) -> tuple[list[dict], list[tuple[str, dict, str, tuple[str, ...]]], list[dict]]:
    """The settings of a group with ``choose: {group: SOURCE, per: FIELDS, by: val_METRIC, lowest: false}``: for each
    value of the ``per`` fields among SOURCE's runs, the setting (its grid values) of the SOURCE run with the
    highest mean validation ``by`` over the seeds every candidate shares, each run read at its epoch selected by the
    summary's ``select`` (the last without one), the first on a tie: the rule of a summary section's ``choose``
    (:func:`kdcollapse.study._choice.chosen_settings`). A choice is made once every SOURCE run it reads is finished
    (its run directory, else its committed record in ``runs.json``); until then it is waiting (second value:
    group, per values, SOURCE, the runs not finished). Third value: every setting it may choose (for checking)."""
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
    validation_only(by, f"group {label!r} chooses its setting on")
    source = [r for r in runs.values() if r.group == spec["group"]]
    if not source:
        raise ConfigError(unknown_choice(f"group that group {label!r} chooses from (an earlier training group)",
                                         spec["group"], tuple(dict.fromkeys(r.group for r in runs.values()))))
    settings, waiting = chosen_settings(label, spec, source, committed_records(path), select, by)
    candidates = []
    for run in source:
        if (setting := {k: v for k, v in run.values.items() if k != "seed"}) not in candidates:
            candidates.append(setting)
    return settings, waiting, candidates
