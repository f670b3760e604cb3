"""An exclusive lock on a run directory, so that two processes never train into the same one.

``fcntl.flock`` on ``RUN_DIR/.lock``: the kernel drops the lock when its holder exits, however it exits,
so a lock left by a dead process never blocks. The file records who holds it, for the error message.
"""

from __future__ import annotations

import fcntl
import json
import os
import platform
import sys
import time
from pathlib import Path

from kdcollapse.errors import CheckpointError

LOCK_FILE = ".lock"


class RunLock:
    """Holds the lock of ``run_dir`` from construction until :meth:`release` (or the process's end).

    The holder is written into the file only by :meth:`write_owner`, when the lock's process starts changing
    the directory: a command refused before that leaves the file as it found it (``release(undo=True)``
    removes a lock file it created). :meth:`check` detects a stolen lock: the file removed or replaced, which
    would let a second process take a lock of its own."""

    def __init__(self, run_dir: Path, *, owner: bool = True):
        self.path = Path(run_dir) / LOCK_FILE
        self.created = not self.path.exists()
        self._file = open(self.path, "a+")  # noqa: SIM115 - held open for the lock's lifetime
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            self._file.seek(0)
            holder = self._file.read().strip()
            self._file.close()
            raise CheckpointError(
                f"{run_dir} is in use by another process ({_describe(holder)}); wait for it to finish or "
                "choose another run_dir"
            ) from None
        if owner:
            self.write_owner()

    def write_owner(self) -> None:
        """Record this process as the holder (pid, host, command, time)."""
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps({"pid": os.getpid(), "host": platform.node(), "command": " ".join(sys.argv),
                                     "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
        self._file.flush()

    def check(self) -> None:
        """Raise if the lock file this process holds is no longer ``run_dir/.lock`` (deleted or replaced)."""
        try:
            same = os.path.samestat(os.fstat(self._file.fileno()), os.stat(self.path))
        except FileNotFoundError:
            same = False
        if not same:
            raise CheckpointError(f"{self.path} was removed or replaced while this process held it, so another "
                                  "process may be writing this run; stopped before the next commit (resume "
                                  "once the other process has finished)")

    def release(self, *, undo: bool = False) -> None:
        """Unlock; ``undo``: also remove the lock file if this lock created it (a refused command)."""
        if not self._file.closed:
            if undo and self.created:
                self.path.unlink(missing_ok=True)
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()


def _describe(holder: str) -> str:
    try:
        info = json.loads(holder)
        return f"pid {info['pid']} on host {info['host']}, since {info['since']}: {info['command']}"
    except (ValueError, KeyError, TypeError):
        return "holder unknown"


def is_locked(run_dir: Path) -> bool:
    """Whether a live process holds the lock of ``run_dir`` (nothing is written)."""
    path = Path(run_dir) / LOCK_FILE
    if not path.is_file():
        return False
    with open(path) as file:
        try:
            fcntl.flock(file.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(file.fileno(), fcntl.LOCK_UN)
    return False
