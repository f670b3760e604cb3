"""Run directories: refuse to mix runs, record provenance, log one JSON line per epoch."""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

from kdcollapse import __version__
from kdcollapse.config import RunConfig, save_config
from kdcollapse.distributed import all_ranks_ok, barrier
from kdcollapse.errors import CheckpointError, ConfigError

# Files a run writes; --overwrite removes exactly these (never anything else the user keeps there).
RUN_FILES = ("config.yaml", "run.json", "metrics.jsonl", "checkpoint.safetensors", "model.safetensors",
             "best.safetensors")
RUN_DIRS = ("tensorboard",)


def git_revision() -> str | None:
    """The commit of the kdcollapse source tree, with ``-dirty`` if it has local changes."""
    here = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=5)
        if rev.returncode != 0:
            return None
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=here,
                               capture_output=True, text=True, timeout=5)
        return rev.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")
    except (OSError, subprocess.SubprocessError):
        return None


def prepare_run_dir(cfg: RunConfig, *, resume: bool, overwrite: bool, is_main: bool = True) -> Path:
    """Check that ``cfg.run_dir`` may be used, then (main process) clear it if asked and record the run.

    Every process checks before any writes: under ``torchrun`` they call this in lock-step, with a
    barrier between the check and the writing.
    """
    run_dir = Path(cfg.run_dir)
    holds_run = (run_dir / "config.yaml").exists()
    if resume and not (run_dir / "checkpoint.safetensors").exists():
        raise CheckpointError(f"cannot resume: {run_dir} holds no checkpoint.safetensors")
    if holds_run and not (resume or overwrite):
        raise CheckpointError(
            f"{run_dir} already holds a run (config.yaml); pass --resume to continue it, --overwrite to "
            "replace it, or choose another run_dir"
        )
    barrier()
    error = None
    if is_main:
        try:
            _write_run_dir(cfg, run_dir, clear=holds_run and not resume, record=not resume)
        except (CheckpointError, OSError) as err:
            error = err
    # Every rank learns whether the main process succeeded, so none is left waiting for a failed one.
    if not all_ranks_ok(error is None):
        raise error or CheckpointError(f"the main process could not prepare the run directory {run_dir}")
    return run_dir


def _write_run_dir(cfg: RunConfig, run_dir: Path, *, clear: bool, record: bool) -> None:
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        probe = run_dir / f".write-test-{os.getpid()}"
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(f"cannot write to run directory {run_dir}: {err.strerror or err}") from None
    if clear:
        for name in RUN_FILES:
            (run_dir / name).unlink(missing_ok=True)
        for name in RUN_DIRS:
            shutil.rmtree(run_dir / name, ignore_errors=True)
    save_config(cfg, run_dir / "config.yaml")  # on resume: records overrides such as more epochs
    if record:
        (run_dir / "run.json").write_text(json.dumps(provenance(), indent=2) + "\n")


def update_run_record(run_dir: Path, facts: dict) -> None:
    """Add ``facts`` (what the run actually executes: precision, memory layout, ...) to ``run.json``."""
    path = Path(run_dir) / "run.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    path.write_text(json.dumps(record | facts, indent=2) + "\n")


def provenance() -> dict:
    return {
        "kdcollapse_version": __version__,
        "git_revision": git_revision(),
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "host": platform.node(),
        "world_size": int(os.environ.get("WORLD_SIZE", "1")),
    }


def read_metrics(run_dir: str | Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


class MetricsLog:
    """Appends one JSON record per epoch to ``metrics.jsonl`` (and TensorBoard when asked).

    On resume, records of epochs after the checkpoint (written before a crash) are dropped first.
    """

    def __init__(self, run_dir: Path, *, start_epoch: int = 0, enabled: bool = True, tensorboard: bool = False):
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.writer = None
        if not enabled:
            return
        kept = [r for r in read_metrics(run_dir) if r["epoch"] <= start_epoch]
        self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("train.tensorboard=true needs the tensorboard package: "
                                  "pip install 'kdcollapse[tensorboard]'") from None
            self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def write(self, record: dict) -> None:
        if not self.enabled:
            return
        with self.path.open("a") as f:
            f.write(json.dumps(record) + "\n")
        if self.writer is not None:
            for key, value in record.items():
                if key != "epoch" and isinstance(value, (int, float)):
                    self.writer.add_scalar(key, value, record["epoch"])

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
