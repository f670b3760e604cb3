"""One run of a study: what it trains (:class:`RunSpec`), its post-run steps (:class:`PostStep`), the config it
trains with and its state. "Done" has one rule, :func:`kdcollapse.runs.run_state` (the committed last epoch),
with the study's two additions: a run finished at fewer epochs than the study now asks for is "interrupted",
and one whose loss diverged (``diverged.json``) is "diverged"."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from kdcollapse.config import load_config
from kdcollapse.errors import ConfigError
from kdcollapse.recipes import config_file
from kdcollapse.runs import Run, run_state

DIVERGED_FILE = "diverged.json"
RESULT_FILE = "result.json"  # the output of a run step; it exists only once the step finished
RECORDS_FILE = "runs.json"  # a study's committed records, beside its file (kdcollapse.study._records)
POST_FIELD = "post"  # a record's list of the post steps' files whose numbers it holds


def committed_records(study_file: Path) -> dict:
    """The records committed beside the study file ``study_file`` (``runs.json``; none: ``{}``), run name → record."""
    path = Path(study_file).parent / RECORDS_FILE
    if not path.is_file():
        return {}
    try:
        records = json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(f"{path} is not JSON ({err}); restore it from git") from None
    if not isinstance(records, dict):
        raise ConfigError(f"{path} is not a mapping of run names to records; restore it from git")
    return records


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


def run_config(run: RunSpec, path: Path | None = None):
    """The ``RunConfig`` the study asks ``run`` to train with (read and checked; nothing is trained or opened:
    a student's teacher need not exist yet); ``path``: its config file, where the caller resolved it already."""
    return load_config(path or config_file(run.config), list(run.overrides))


def state_of(run: RunSpec) -> str:
    """:func:`kdcollapse.runs.run_state`, except that a run finished at fewer epochs than the study now asks
    for is "interrupted" (a resume extends it: ``train.epochs`` may change on resume), and one whose loss
    diverged (``diverged.json``, not finished) is "diverged". A run step is "finished" once its ``result.json``
    exists, "running" while a process holds its lock, else "new"."""
    if run.step is not None:
        return "finished" if (run.run_dir / RESULT_FILE).is_file() else "running" if run_state(run.run_dir) == "running" \
            else "new"
    state = run_state(run.run_dir)
    if state == "finished" and Run(run.run_dir).config.train.epochs < run_config(run).train.epochs:
        return "interrupted"
    if state in ("new", "interrupted") and (run.run_dir / DIVERGED_FILE).is_file():
        return "diverged"
    return state
