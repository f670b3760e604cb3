"""Running a study's runs: one run in this process (:func:`execute`, what every executor calls), the local
executor (a process pool, N at a time, teachers before their students) and the status of every run.

"Done" has one rule (:func:`kdcollapse.study._runs.state_of`: the committed last epoch); a finished run is skipped,
an interrupted one resumed from its committed epoch, and a run whose directory another process holds (its
lock) is left to that process. A run whose loss diverged is a result, not an error: ``diverged.json`` in its
run directory records the epoch it broke in, the summary reports it, and later launches leave it alone (delete
the file to try it again).
"""

from __future__ import annotations

import inspect
import json
import multiprocessing
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass

import torch

from kdcollapse.errors import CheckpointError
from kdcollapse.runs import (RunLock, lm_source, read_metrics, record_outputs, run_lock_for, run_state, source_of,
                            write_text)
from kdcollapse.study._runs import (DIVERGED_FILE, POST_FIELD, RESULT_FILE, RunSpec, committed_records, run_config,
                                   state_of)
from kdcollapse.study._spec import Study
from kdcollapse.study._steps import RUN_STEPS, STEPS
from kdcollapse.train import TrainingDiverged, fit

OUTCOMES = ("finished", "diverged", "failed", "running elsewhere", "blocked")


@dataclass(frozen=True)
class Outcome:
    """What became of one run in this launch: one of ``OUTCOMES`` and a message."""

    name: str
    status: str
    message: str = ""


def execute(run: RunSpec, threads: int | None = None) -> Outcome:
    """Train ``run`` unless it is finished (resuming an interrupted one), then its post steps. A diverged run
    is an outcome, not an error (recorded in ``diverged.json``, and its post steps run on its last good epoch);
    a teacher that is not finished blocks its students."""
    if threads:
        torch.set_num_threads(threads)
    if run.step is not None:
        return _run_step(run)
    state = state_of(run)
    if state == "running":
        return Outcome(run.name, "running elsewhere", "another process holds its run directory")
    outcome = Outcome(run.name, state)
    if state not in ("finished", "diverged"):
        if run.teacher_dir is not None and run_state(run.teacher_dir) != "finished":
            return Outcome(run.name, "blocked", f"its teacher {run.teacher_dir} is not finished")
        cfg = run_config(run)
        try:
            fit(cfg, resume=state == "interrupted", overwrite=state == "new" and (run.run_dir / "config.yaml").exists())
            outcome = Outcome(run.name, "finished")
        except TrainingDiverged as err:
            with run_lock_for(run.run_dir / DIVERGED_FILE):  # the trainer has let go; no other process may write
                _write_json(run.run_dir / DIVERGED_FILE, {"epoch": len(read_metrics(run.run_dir)) + 1,
                                                          "message": str(err)})
            outcome = Outcome(run.name, "diverged", str(err))
        except CheckpointError as err:
            if "in use by another process" in str(err):
                return Outcome(run.name, "running elsewhere", str(err))
            raise
    if outcome.status == "diverged" and not (run.run_dir / "model.safetensors").is_file():
        return outcome  # no epoch to measure
    for step in run.post:
        if step.done(run.run_dir):
            continue
        if step.step is not None:
            _write_step(run.run_dir, step.creates, STEPS[step.step])
            continue
        done = subprocess.run([sys.executable, "-m", "kdcollapse", step.command, str(run.run_dir), *step.args],
                              capture_output=True, text=True)
        if done.returncode != 0:
            return Outcome(run.name, "failed", f"{step.command}: {done.stderr.strip()[-500:]}")
    return outcome


def _run_step(run: RunSpec) -> Outcome:
    """A registered computation instead of training: done once ``result.json`` exists; the run directory's lock
    keeps two launches from computing it twice."""
    if (run.run_dir / RESULT_FILE).is_file():
        return _step_posts(run)
    step = RUN_STEPS[run.step]
    if "run_dir" in inspect.signature(step).parameters:  # a step that locks its run directory itself
        try:
            result = step(seed=run.values["seed"], run_dir=run.run_dir, **run.params)
        except CheckpointError as err:
            if "in use by another process" in str(err):
                return Outcome(run.name, "running elsewhere", str(err))
            raise
        _write_json(run.run_dir / RESULT_FILE, {"step": run.step, "params": run.params, **result})
        return _step_posts(run)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    try:
        lock = RunLock(run.run_dir)
    except CheckpointError as err:
        return Outcome(run.name, "running elsewhere", str(err))
    try:
        torch.manual_seed(run.values["seed"])
        _write_json(run.run_dir / RESULT_FILE, {"step": run.step, "params": run.params,
                                                 **RUN_STEPS[run.step](seed=run.values["seed"], **run.params)})
    finally:
        lock.release()
    return _step_posts(run)


def _step_posts(run: RunSpec) -> Outcome:
    """The registered post steps of a finished run step (e.g. ``lm_collapse`` of a ``distill_lm`` run)."""
    for step in run.post:
        if not step.done(run.run_dir):
            _write_step(run.run_dir, step.creates, STEPS[step.step])
    return Outcome(run.name, "finished")


def _end_with_launcher(launcher: int) -> None:
    """In a worker: end it when the launching process ``launcher`` is gone (killed, not shut down), so that no run
    trains on unattended (the forkserver that started the worker outlives the launcher); what the run committed
    stays, and the next launch resumes it."""

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(launcher, 0)
            except ProcessLookupError:
                os._exit(1)

    threading.Thread(target=watch, daemon=True, name="kdcollapse-launcher-watch").start()


def _write_json(path, value: dict) -> None:
    """``value`` as JSON in ``path``, whole or not at all (written beside it, flushed, then renamed)."""
    write_text(path, json.dumps(value, indent=1) + "\n")


def _write_step(run_dir, name: str, step: Callable) -> None:
    """A registered post step's output ``run_dir/name``: computed and written under the run's lock and listed in
    its ``outputs.json`` with the weights it measured (an image run's committed model; a language-model run's
    ``student/``, by the digest of its files), so that ``--overwrite`` removes it (the step is then done again) and
    ``Run.stale_outputs`` flags it once the weights change."""
    path = run_dir / name
    with run_lock_for(path) as held:
        value = step(run_dir)
        _write_json(path, value)
        if held is not None:
            record_outputs(held, [path], source_of(held) if (held / "model.safetensors").is_file()
                           else lm_source(held / "student", held) if (held / "student").is_dir() else {})


def recorded(study: Study) -> set[str]:
    """The runs whose record is committed (``runs.json`` beside the study file) and whose run directory is absent:
    finished on another machine or in an earlier session whose directories are gone. They are done: a launch does
    not run them again (their records feed the page and the choices), and ``status`` calls them "recorded". A
    record that lacks one of its run's post steps (its ``post`` list: the step was added later, or its run
    directory was lost before the step ran) is not: the run is trained again, so the step can measure its weights
    (a diverged run's record is complete as it is). To redo one, delete its record."""
    records = committed_records(study.path)
    return {name for name, run in study.runs.items() if name in records and not run.run_dir.exists() and (
        "diverged" in records[name] or {s.creates for s in run.post} <= set(records[name].get(POST_FIELD, ())))}


def pending(study: Study, names: list[str] | None = None) -> list[RunSpec]:
    """The runs (of ``names``, else all; an empty list: none) that still have something to do: training, or a post
    step (of a finished run, or a diverged one with a saved epoch). A run recorded (:func:`recorded`) has none."""
    runs = [study.runs[n] for n in names] if names is not None else list(study.runs.values())
    done = recorded(study)
    return [r for r in runs if r.name not in done and ((state := state_of(r)) not in ("finished", "diverged") or any(
        not s.done(r.run_dir) for s in r.post)
        and (state == "finished" or (r.run_dir / "model.safetensors").is_file()))]


def status(study: Study) -> dict[str, str]:
    """Run name → its state (``kdcollapse.runs.RUN_STATES``, "diverged", or "recorded": see :func:`recorded`)."""
    done = recorded(study)
    return {name: "recorded" if name in done else state_of(run) for name, run in study.runs.items()}


def run_local(study: Study, runs: list[RunSpec], workers: int = 1, threads: int = 1,
              report: Callable[[Outcome], None] = lambda o: None) -> list[Outcome]:
    """Run ``runs`` in ``workers`` fresh processes of ``threads`` threads each; a student starts once its
    teacher finished in this launch (or before it). Returns the outcomes in completion order."""
    todo, outcomes, futures = list(runs), {}, {}
    names = {r.name for r in runs}
    context = multiprocessing.get_context("forkserver")  # fresh processes, torch imported once (in the server)
    context.set_forkserver_preload(["kdcollapse.study._execute"])
    with ProcessPoolExecutor(max_workers=workers, mp_context=context, initializer=_end_with_launcher,
                             initargs=(os.getpid(),)) as pool:
        while todo or futures:
            for run in list(todo):
                if run.teacher in names and run.teacher not in outcomes:
                    continue  # its teacher is still to run in this launch
                todo.remove(run)
                if run.teacher in outcomes and outcomes[run.teacher].status != "finished":
                    outcomes[run.name] = Outcome(run.name, "blocked", f"its teacher {run.teacher} did not finish")
                    report(outcomes[run.name])
                    continue
                futures[pool.submit(execute, run, threads)] = run
            if not futures:
                continue
            done, _ = wait(futures, return_when=FIRST_COMPLETED)
            for future in done:
                run = futures.pop(future)
                try:
                    outcomes[run.name] = future.result()
                except Exception as err:  # noqa: BLE001 - one failed run must not stop the others
                    outcomes[run.name] = Outcome(run.name, "failed", f"{type(err).__name__}: {err}")
                report(outcomes[run.name])
    return list(outcomes.values())
