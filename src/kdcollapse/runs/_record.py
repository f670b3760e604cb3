"""``run.json``: a run's provenance, and the SHA-256 of the ``config.yaml`` it wrote (a hand edit is refused)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import torch

from kdcollapse import __version__
from kdcollapse.distributed import hardware
from kdcollapse.errors import CheckpointError
from kdcollapse.runs._atomic import write_text


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


def read_run_json(run_dir: Path) -> dict | None:
    """``run.json`` of ``run_dir`` (``None`` if absent); a damaged one is an error naming the file."""
    path = Path(run_dir) / "run.json"
    if not path.exists():
        return None
    try:
        facts = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is not valid JSON ({err}); it is not a run kdcollapse wrote intact") from None
    if not isinstance(facts, dict):
        raise CheckpointError(f"{path} is not a JSON object; it is not a run kdcollapse wrote intact")
    return facts


def check_config_unedited(run_dir: Path, example: str = "train.epochs=N") -> None:
    """Refuse a ``config.yaml`` whose bytes differ from the SHA-256 that ``run.json`` recorded when the run
    wrote it: a hand edit would say one thing while the checkpoint continues another; and a ``run.json`` that
    records no digest (``{}``): kdcollapse did not write it. ``example``: an override the message shows (the
    trainer's resumable key)."""
    facts = read_run_json(run_dir)
    if facts is None:
        return
    if not isinstance(facts.get("config_sha256"), str):
        raise CheckpointError(f"{run_dir / 'run.json'} records no config_sha256, so it is not the run.json "
                              "kdcollapse wrote; restore it from where the run came from")
    recorded = {facts.get("config_sha256"), facts.get("config_sha256_previous")} - {None}
    path = Path(run_dir) / "config.yaml"
    if recorded and path.exists() and hashlib.sha256(path.read_bytes()).hexdigest() not in recorded:
        raise CheckpointError(f"{path} was edited after the run wrote it (its SHA-256 differs from run.json's "
                              "config_sha256); restore it, and change resumable keys with overrides: --resume "
                              f"{run_dir} {example}")


def update_run_record(run_dir: Path, facts: dict) -> None:
    """Add ``facts`` (what the run actually executes: precision, memory layout, ...) to ``run.json``."""
    path = Path(run_dir) / "run.json"
    record = json.loads(path.read_text()) if path.exists() else {}
    write_text(path, json.dumps(record | facts, indent=2) + "\n")


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
        "hardware": hardware(),  # CPU model and capability, GPU, torch/CUDA/cuDNN versions
    }
