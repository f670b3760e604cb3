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
    """Holds the lock of ``run_dir`` from construction until :meth:`release` (or the process's end)."""

    def __init__(self, run_dir: Path):
        self.path = Path(run_dir) / LOCK_FILE
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
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps({"pid": os.getpid(), "host": platform.node(), "command": " ".join(sys.argv),
                                     "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
        self._file.flush()

    def release(self) -> None:
        if not self._file.closed:
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
