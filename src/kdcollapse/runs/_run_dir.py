"""Run directories: one process at a time, validated before anything is changed, one commit per epoch
(provenance in ``run.json``: ``_record``; the per-epoch records: ``_metrics_log``).

A run directory is taken in two steps. :func:`claim_run_dir` locks it and checks that it may be used
(nothing is changed but the lock file; a directory that does not exist yet is only checked to be creatable,
and is neither created nor locked); the trainer then builds its data, teacher, model and method, and only
when all of that worked does :func:`start_run_dir` create and lock a new directory, clear an overwritten run
and write the config.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

from kdcollapse.config import RunConfig, config_to_dict, save_config
from kdcollapse.config_lm import LM_RESUMABLE_KEYS, LMConfig, load_run_config
from kdcollapse.data import USER_DATA
from kdcollapse.distributed import all_ranks_ok
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.runs._atomic import remove_temporaries, replacing, write_text
from kdcollapse.runs._checkpoint import read_header, save_tensors
from kdcollapse.runs._commit import STATE_FILE, commit_epoch, recover
from kdcollapse.runs._data import PASS_AGAIN
from kdcollapse.runs._derived import remove_outputs
from kdcollapse.runs._lock import RunLock
from kdcollapse.runs._metrics_log import read_committed_metrics
from kdcollapse.runs._record import check_config_unedited, provenance, read_run_json

# Files a run writes; --overwrite removes exactly these (never anything else the user keeps there).
RUN_FILES = ("config.yaml", "run.json", "metrics.jsonl", "metrics.csv", "checkpoint.safetensors",
             "model.safetensors", "best.safetensors", STATE_FILE)
# Derived outputs (analyze, robust-eval) describe the weights of the run they were computed from: --overwrite
# removes them with the run, so no old number sits beside a new model.
RUN_FILES += ("robust_eval.json", "robust_eval.md")
RUN_DIRS = ("tensorboard", "analysis_train", "analysis_val", "analysis_test", "student")  # student/: distill-lm's
RUN_FILES += ("steps.jsonl",)  # per-step scalars (distill-lm)

# Config keys a resume may change: how long to train, how often to evaluate and analyse, how to log, where
# to compute and how to load. Every other key defines the run, and a resumed run must stay the same run.
RESUMABLE_KEYS = ("run_dir", "train.epochs", "train.eval_every", "train.progress", "train.tensorboard", "train.trackers",
                  "train.group", "train.log_every",
                  "train.device", "train.compile", "data.num_workers", "data.eval_batch_size", "analysis.every",
                  "analysis.train_per_class")


class RunDir:
    """A claimed run directory. On the main process it holds the lock, the committed ``state`` and the
    weight files that recovery found damaged; other processes hold only the path."""

    def __init__(self, path: Path, *, is_main: bool, resume: bool):
        self.path, self.is_main, self.resume, self.clear = path, is_main, resume, False
        self.created: Path | None = None  # the topmost folder start_run_dir created (None: run_dir existed)
        self.started = False  # set by start_run_dir: from then on the directory is the run's
        self.lock: RunLock | None = None
        self.state: dict | None = None
        self.damaged: list[str] = []

    def commit(self, epoch: int, tensor_files: dict, text_files: dict[str, str]) -> None:
        """Write and commit the files of ``epoch`` (see :mod:`kdcollapse.runs._commit`); ``text_files`` are
        :meth:`MetricsLog.files`."""
        if self.lock is not None:
            self.lock.check()
        self.state = commit_epoch(self.path, epoch, tensor_files, text_files, self.state)

    def replace_file(self, name: str, tensors: dict, meta: dict) -> None:
        """Re-derive a damaged weight file of the committed epoch and record it."""
        digest = save_tensors(self.path / name, tensors, meta)
        if self.state is not None:
            self.state["files"][name] = {"epoch": self.state["epoch"], "sha256": digest}
            write_text(self.path / STATE_FILE, json.dumps(self.state, indent=1) + "\n")

    def file_epoch(self, name: str) -> int | None:
        """The epoch recorded in a weight file's metadata (``None`` if it is missing or unreadable)."""
        try:
            return read_header(self.path / name)[0].get("epoch")
        except CheckpointError:
            return None

    def create_and_lock(self) -> None:
        """Create the directory, remembering the topmost folder made (removed again if the run never starts),
        and lock it."""
        self.created = next((p for p in [*reversed(self.path.parents), self.path] if not p.exists()), None)
        _make_writable(self.path)
        self.lock = RunLock(self.path, owner=False)

    def release(self) -> None:
        """Unlock. Before :func:`start_run_dir` nothing of the directory was the run's: the lock file it created
        is removed (and the folders, if start_run_dir failed right after creating them), so a refused command
        leaves the disk as it was."""
        if self.lock is not None:
            self.lock.release(undo=not self.started)
            self.lock = None
        if self.is_main and self.created is not None and not self.started:
            for folder in [self.path, *self.path.parents]:
                with contextlib.suppress(OSError):
                    folder.rmdir()  # only if empty
                if folder == self.created:
                    break


def claim_run_dir(cfg: RunConfig, *, resume: bool, overwrite: bool, is_main: bool = True) -> RunDir:
    """Lock ``cfg.run_dir`` (main process) and check that it may be used; on resume, complete an epoch
    committed before a crash. Nothing of an existing run changes here.

    Under ``torchrun`` every process calls this; each learns whether the main process succeeded, so none is
    left waiting for a failed one.
    """
    run_dir = Path(cfg.run_dir)
    claim = RunDir(run_dir, is_main=is_main, resume=resume)

    def take() -> None:
        if not run_dir.exists():  # nothing to lock or clear: checked now, created by start_run_dir
            _check_creatable(run_dir)
            _check_use(cfg, run_dir, holds_run=False, resume=resume, overwrite=overwrite)
            return
        _make_writable(run_dir)
        claim.lock = RunLock(run_dir, owner=False)
        try:
            holds_run = (run_dir / "config.yaml").exists()  # looked at under the lock
            # a run that stopped before its first commit (killed, diverged, a full disk) holds nothing trained:
            # the same or a corrected command starts it again cleanly
            restart = holds_run and not resume and _uncommitted_run(run_dir)
            claim.clear = holds_run and (overwrite or restart) and not resume
            _check_use(cfg, run_dir, holds_run=holds_run and not restart, resume=resume, overwrite=overwrite)
            if resume:
                claim.state, claim.damaged = recover(run_dir)
                if "checkpoint.safetensors" in claim.damaged:
                    raise CheckpointError(
                        f"cannot resume: {run_dir / 'checkpoint.safetensors'} is missing or is not the checkpoint "
                        f"of epoch {claim.state['epoch']} that {STATE_FILE} records"
                    )
                _check_resume_history(cfg, run_dir, claim.state)
        except BaseException:
            claim.release()
            raise

    on_main_process(is_main, take, f"the main process could not prepare the run directory {run_dir}")
    return claim


def on_main_process(is_main: bool, action, failure: str) -> None:
    """Run ``action`` on the main process; every process raises if it failed (a collective under
    ``torchrun``, so that no process is left waiting for a failed one)."""
    error = None
    if is_main:
        try:
            action()
        except (KdcollapseError, OSError) as err:
            error = err
    if not all_ranks_ok(error is None):
        raise error or CheckpointError(failure)


def start_run_dir(cfg: RunConfig, claim: RunDir) -> None:
    """After everything was validated: clear an overwritten run, remove stray temporaries, write the config
    (on resume: with its permitted changes) and, for a new run, ``run.json``."""
    def write() -> None:
        if claim.lock is None:  # a new directory: created and locked only now
            claim.create_and_lock()
            if (claim.path / "config.yaml").exists():  # another process started a run here meanwhile
                _check_use(cfg, claim.path, holds_run=True, resume=False, overwrite=False)
        claim.lock.write_owner()
        claim.started = True
        if claim.clear:
            remove_outputs(claim.path)  # what analyze/plot --out wrote into the run directory
            for name in RUN_FILES:
                (claim.path / name).unlink(missing_ok=True)
            for name in RUN_DIRS:
                shutil.rmtree(claim.path / name, ignore_errors=True)
        remove_temporaries(claim.path)
        # run.json records the SHA-256 of config.yaml, which a resume compares (a hand edit is refused). On a
        # resume it is written before the new config replaces the old, keeping the old digest too, so a crash
        # between the two renames leaves a pair that still matches.
        facts = read_run_json(claim.path) if claim.resume else None
        with replacing(claim.path / "config.yaml") as tmp:
            save_config(cfg, tmp)
            digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
            if facts is not None and facts.get("config_sha256") != digest:
                previous = facts.get("config_sha256")
                write_text(claim.path / "run.json", json.dumps(
                    {**facts, "config_sha256": digest, "config_sha256_previous": previous}, indent=2) + "\n")
        if not claim.resume:
            write_text(claim.path / "run.json", json.dumps({**provenance(), "config_sha256": digest}, indent=2) + "\n")

    on_main_process(claim.is_main, write, f"the main process could not write the run directory {claim.path}")


def _make_writable(run_dir: Path) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(f"cannot write to run directory {run_dir}: {err.strerror or err}") from None


def _check_creatable(run_dir: Path) -> None:
    """Refuse a run directory that cannot be created (its nearest existing folder is a file or is not
    writable), without creating anything."""
    existing = next(p for p in [run_dir, *run_dir.parents] if p.exists())
    if not existing.is_dir():
        raise CheckpointError(f"cannot write to run directory {run_dir}: {existing} is not a directory")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise CheckpointError(f"cannot write to run directory {run_dir}: {existing} is not writable")
    try:  # access() passes for root where mkdir fails (/proc): a folder made and removed at once
        os.rmdir(tempfile.mkdtemp(prefix=".kdcollapse-probe-", dir=existing))
    except OSError as err:
        raise CheckpointError(f"cannot write to run directory {run_dir}: {err.strerror or err}") from None


def _uncommitted_run(run_dir: Path) -> bool:
    """Whether ``run_dir`` holds a kdcollapse run (its ``config.yaml`` unedited, as ``run.json`` records) that
    committed no epoch. A ``config.yaml`` that kdcollapse did not write is never one."""
    if _committed(run_dir):
        return False
    try:
        facts = read_run_json(run_dir) or {}
    except CheckpointError:
        return False
    config = run_dir / "config.yaml"
    return config.is_file() and facts.get("config_sha256") == hashlib.sha256(config.read_bytes()).hexdigest()


def _committed(run_dir: Path) -> bool:
    """Whether the run in ``run_dir`` committed at least one epoch."""
    return (run_dir / "checkpoint.safetensors").exists() or (run_dir / STATE_FILE).exists()


def _check_use(cfg: RunConfig, run_dir: Path, *, holds_run: bool, resume: bool, overwrite: bool) -> None:
    if resume:
        if not _committed(run_dir):
            raise CheckpointError(
                f"cannot resume: {run_dir} holds no checkpoint.safetensors" + (
                    " (the run stopped before its first epoch was committed); start it again with the same "
                    "command without --resume" if holds_run else ""))
        check_config_unedited(run_dir, "steps=N" if isinstance(cfg, LMConfig) else "train.epochs=N")
        if holds_run:
            check_resume_changes(load_run_config(run_dir / "config.yaml"), cfg)
    elif holds_run and not overwrite:
        other = _other_config(run_dir, cfg)
        if other:
            raise CheckpointError(f"{run_dir} already holds a run of another config ({other}); choose another "
                                  "run_dir, or pass --overwrite to replace it")
        raise CheckpointError(
            f"{run_dir} already holds a run (config.yaml); continue it with `--resume {run_dir}`, replace it "
            "with --overwrite, or choose another run_dir"
        )
    elif holds_run:
        _check_not_teacher(cfg, run_dir)


def check_run_dirs(cfgs: list[RunConfig], *, overwrite: bool, is_main: bool = True) -> None:
    """Check every run directory of a series (``--seeds``) before the first run starts, so that a problem
    with the last one is reported before the first trains: not in use by another process, free or
    ``overwrite`` (and then not holding the series' teacher). Existing directories only; nothing changes."""
    def check() -> None:
        for cfg in cfgs:
            run_dir = Path(cfg.run_dir)
            if not run_dir.is_dir():
                continue
            lock = RunLock(run_dir, owner=False)
            try:
                holds_run = (run_dir / "config.yaml").exists() and not _uncommitted_run(run_dir)
                _check_use(cfg, run_dir, holds_run=holds_run, resume=False, overwrite=overwrite)
            finally:
                lock.release(undo=True)

    on_main_process(is_main, check, "the main process found a run directory that cannot be used")


def _other_config(run_dir: Path, cfg: RunConfig) -> str:
    """How the run saved in ``run_dir`` differs from ``cfg`` in a defining key ("" when it does not)."""
    try:
        saved = load_run_config(run_dir / "config.yaml")
    except KdcollapseError as err:
        return f"its config.yaml does not load: {err}"
    old, new = config_differences(saved, cfg)
    return ", ".join(f"{k}={old[k]!r} there, {new[k]!r} here" for k in old)


def check_same_config(run_dirs: list[Path], ignore: tuple[str, ...] = ("seed",)) -> None:
    """Refuse to combine runs (a summary over seeds) whose saved configs differ in a defining key other
    than ``ignore``."""
    first, *rest = [Path(d) for d in run_dirs]
    base = load_run_config(first / "config.yaml")
    for run_dir in rest:
        old, new = config_differences(base, load_run_config(run_dir / "config.yaml"), ignore)
        if old:
            keys = ", ".join(f"{k}={old[k]!r} in {first}, {new[k]!r} in {run_dir}" for k in old)
            raise ConfigError(f"cannot summarise runs of different configs ({keys}); give each config its own "
                              "run_dir")


def _check_not_teacher(cfg: RunConfig, run_dir: Path) -> None:
    """--overwrite must never delete the teacher it is about to distil from."""
    teacher = cfg.teacher if isinstance(cfg, LMConfig) else (
        cfg.teacher.checkpoint or (cfg.teacher.weights and str(Path(cfg.teacher.weights).parent)))
    if not teacher:
        return
    here, there = run_dir.resolve(), Path(teacher).resolve()
    if there == here or here in there.parents:
        raise CheckpointError(
            f"--overwrite would delete {run_dir}, which holds this run's teacher ({teacher}); choose another "
            "run_dir"
        )


def _flat(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and key != "kwargs":
            out |= _flat(value, f"{prefix}{key}.")
        else:
            out[f"{prefix}{key}"] = value
    return out


def config_differences(a: RunConfig | LMConfig, b: RunConfig | LMConfig, ignore: tuple[str, ...] = ()) -> tuple[dict, dict]:
    """The defining keys (all but the task's resumable keys, :data:`RESUMABLE_KEYS` or
    ``LM_RESUMABLE_KEYS``, and ``ignore``) whose values differ between ``a`` and ``b``: ``({key: value in
    a}, {key: value in b})``, sorted by key (configs of two tasks differ in ``task``)."""
    if type(a) is not type(b):
        task = {RunConfig: "image", LMConfig: "lm"}
        return {"task": task.get(type(a))}, {"task": task.get(type(b))}
    old, new = _flat(config_to_dict(a)), _flat(config_to_dict(b))
    skip = set(resumable_keys(a)) | set(ignore)
    changed = sorted(k for k in old.keys() | new.keys() if old.get(k) != new.get(k) and k not in skip)
    return {k: old.get(k) for k in changed}, {k: new.get(k) for k in changed}


def resumable_keys(cfg: RunConfig | LMConfig) -> tuple[str, ...]:
    """The keys a resume of a run of ``cfg``'s task may change."""
    return ("run_dir", *LM_RESUMABLE_KEYS) if isinstance(cfg, LMConfig) else RESUMABLE_KEYS


def _check_resume_history(cfg: RunConfig | LMConfig, run_dir: Path, state: dict | None) -> None:
    """A resume continues the committed history, never rewrites it: ``train.epochs`` below the committed
    epoch is refused, and so is a metrics log that is not the committed one, here, before anything is written."""
    epoch = (state or {}).get("epoch")
    if isinstance(cfg, RunConfig) and isinstance(epoch, int) and cfg.train.epochs < epoch:
        raise ConfigError(f"cannot resume {run_dir} with train.epochs={cfg.train.epochs}: it has committed {epoch} "
                          f"epochs, which a resume never rewrites; give train.epochs >= {epoch} (or a new run_dir)")
    read_committed_metrics(run_dir)


def check_resume_changes(saved: RunConfig | LMConfig, cfg: RunConfig | LMConfig) -> None:
    """A resume may change only the task's resumable keys; anything else would continue another run."""
    if isinstance(saved, RunConfig) and isinstance(cfg, RunConfig) and saved.data.name == USER_DATA != cfg.data.name:
        raise ConfigError(f"cannot resume: the run was trained on data passed from Python (data.name="
                          f"{USER_DATA!r}), not on {cfg.data.name!r}; {PASS_AGAIN}")
    old, new = config_differences(saved, cfg)
    if old:
        was = ", ".join(f"{k}={v!r}" for k, v in old.items())
        now = ", ".join(f"{k}={v!r}" for k, v in new.items())
        raise ConfigError(
            f"cannot resume: the run was trained with {was}; the config asks for {now}. A resume may change "
            f"only {', '.join(resumable_keys(cfg)[1:])}; start a new run_dir for anything else"
        )

