"""One commit point per epoch: ``state.json``.

Every file of an epoch (checkpoint, model, best, metrics) is first written in full under a staged name
``.NAME.epochN.tmp`` and flushed to disk; then ``state.json`` (the epoch and each file's SHA-256) is
replaced atomically — that rename is the commit — and only then are the staged files renamed into place.
A crash before the commit leaves the previous epoch untouched (the staged files are stray temporaries);
a crash after it leaves staged files that :func:`recover` renames, so ``state.json`` is always the truth.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch

from kdcollapse.errors import CheckpointError
from kdcollapse.runs._atomic import remove_temporaries, rename, temporary_path, writing
from kdcollapse.runs._checkpoint import read_header, write_tensors

STATE_FILE = "state.json"


def staged_path(run_dir: Path, name: str, epoch: int) -> Path:
    return run_dir / f".{name}.epoch{epoch}.tmp"


def read_state(run_dir: Path) -> dict | None:
    """The committed state of ``run_dir`` (``None`` for a directory written before state files existed)."""
    path = run_dir / STATE_FILE
    if not path.is_file():
        return None
    try:
        state = json.loads(path.read_text())
        ok = isinstance(state["epoch"], int) and all(
            isinstance(e["sha256"], str) and isinstance(e["epoch"], int) for e in state["files"].values())
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError):
        ok = False
    if not ok:
        raise CheckpointError(f"{path} is damaged; it records which files belong to the last completed epoch")
    return state


def commit_epoch(run_dir: Path, epoch: int, tensor_files: dict[str, tuple[dict[str, torch.Tensor], dict]],
                 text_files: dict[str, str], previous: dict | None) -> dict:
    """Write the files of ``epoch`` and commit them; returns the new state. Files of ``previous`` that this
    epoch does not rewrite (``best.safetensors`` when the epoch did not improve) stay recorded."""
    entries = dict(previous["files"]) if previous else {}
    staged: list[tuple[Path, str]] = []
    try:
        for name, (tensors, meta) in tensor_files.items():
            tmp = staged_path(run_dir, name, epoch)
            with writing(run_dir / name, tmp):
                digest = write_tensors(tmp, tensors, meta)
            staged.append((tmp, name))
            entries[name] = {"epoch": epoch, "sha256": digest}
        for name, text in text_files.items():
            tmp = staged_path(run_dir, name, epoch)
            with writing(run_dir / name, tmp):
                tmp.write_text(text)
            staged.append((tmp, name))
            entries[name] = {"epoch": epoch, "sha256": hashlib.sha256(text.encode()).hexdigest()}
        state = {"format": "kdcollapse.state", "version": 1, "epoch": epoch, "files": entries}
        state_tmp = temporary_path(run_dir / STATE_FILE)
        with writing(run_dir / STATE_FILE, state_tmp):
            state_tmp.write_text(json.dumps(state, indent=1) + "\n")
    except BaseException:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)
        raise
    # The commit point. From here on the staged files are the epoch's: an interruption (Ctrl-C in the directory's
    # fsync, a full disk in a rename) must leave them for `--resume` to rename, not remove them.
    rename(state_tmp, run_dir / STATE_FILE)
    for tmp, name in staged:
        rename(tmp, run_dir / name)
    return state


def recover(run_dir: Path) -> tuple[dict | None, list[str]]:
    """Complete an epoch committed before a crash and remove stray temporaries.

    Returns the state and the names of the weight files it records that are missing or differ from it (the
    trainer re-derives those it can from the checkpoint).
    """
    state = read_state(run_dir)
    damaged = []
    for name, entry in (state or {"files": {}})["files"].items():
        if file_digest(run_dir / name) == entry["sha256"]:
            continue
        staged = staged_path(run_dir, name, entry["epoch"])
        if file_digest(staged) == entry["sha256"]:
            rename(staged, run_dir / name)
        elif name.endswith(".safetensors"):
            damaged.append(name)
    remove_temporaries(run_dir)
    return state, damaged


def committed_file(run_dir: Path, name: str) -> tuple[Path | None, dict | None]:
    """``(path, state)``: where ``name`` holds what the last commit recorded, read-only (no repair).

    ``run_dir / name`` when its digest is the recorded one, or when ``state.json`` is absent (a run of an
    older version) or does not list ``name``; between a commit and the renames that complete it (a crash,
    or a trainer at that instant) the staged file the commit recorded; ``None`` when neither matches (a
    file left by an interrupted write or replaced by hand, which a resume repairs).
    """
    state = read_state(run_dir)
    entry = state["files"].get(name) if state else None
    path = run_dir / name
    if entry is None:
        return path, state
    for candidate in (path, staged_path(run_dir, name, entry["epoch"])):
        if file_digest(candidate) == entry["sha256"]:
            return candidate, state
    return None, state


def committed_path(run_dir: Path, name: str) -> Path:
    """The file holding ``name`` as the last commit (``state.json``) recorded it (see
    :func:`committed_file`); ``CheckpointError`` naming ``--resume`` when none does."""
    path, state = committed_file(run_dir, name)
    if path is None:
        raise CheckpointError(
            f"{run_dir / name} is not the file of epoch {state['epoch']} that state.json records (an interrupted "
            f"write, or a file replaced by hand); run `kdcollapse train --resume {run_dir}` to repair it from the "
            "checkpoint"
        )
    return path


def file_digest(path: Path) -> str | None:
    """The digest ``state.json`` records for ``path``: a safetensors file's tensor digest (from its header),
    else the SHA-256 of its bytes; ``None`` if it is missing or unreadable."""
    if not path.is_file():
        return None
    if ".safetensors" in path.name:
        try:
            return read_header(path)[1]
        except CheckpointError:
            return None
    return hashlib.sha256(path.read_bytes()).hexdigest()
