"""An exclusive lock on a run directory, so that two processes never train into the same one.

``fcntl.flock`` on ``RUN_DIR/.lock``: the kernel drops the lock when its holder exits, however it exits,
so a lock left by a dead process never blocks. The file records who holds it, for the error message. A
lock file may be removed (``release(undo=True)``), so a lock counts only on the file still at the path: the
remover unlinks before it unlocks, and a locker checks after locking that its file is still the path's.
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
ATTEMPTS = 10  # of locking the file at the path, each time its holder removed it in between


class RunLock:
    """Holds the lock of ``run_dir`` from construction until :meth:`release` (or the process's end).

    The holder is written into the file only by :meth:`write_owner`, when the lock's process starts changing
    the directory: a command refused before that leaves the file as it found it (``release(undo=True)``
    removes a lock file it created). :meth:`check` detects a stolen lock: the file removed or replaced, which
    would let a second process take a lock of its own."""

    def __init__(self, run_dir: Path, *, owner: bool = True):
        self.path = Path(run_dir) / LOCK_FILE
        for _ in range(ATTEMPTS):
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
            if self._holds_path():
                break
            # Its holder removed the file (release(undo=True)) between our open and our lock: what we hold is
            # no lock anyone else sees. Lock the file now at the path instead.
            fcntl.flock(self._file.fileno(), fcntl.LOCK_UN)
            self._file.close()
        else:
            raise CheckpointError(f"{self.path} was removed {ATTEMPTS} times while this process was locking it; "
                                  "another program keeps deleting it: stop it, or choose another run_dir")
        if owner:
            self.write_owner()

    def _holds_path(self) -> bool:
        """Whether the file this process opened is still ``run_dir/.lock`` (not deleted or replaced)."""
        try:
            return os.path.samestat(os.fstat(self._file.fileno()), os.stat(self.path))
        except FileNotFoundError:
            return False

    def write_owner(self) -> None:
        """Record this process as the holder (pid, host, command, time)."""
        self._file.seek(0)
        self._file.truncate()
        self._file.write(json.dumps({"pid": os.getpid(), "host": platform.node(), "command": " ".join(sys.argv),
                                     "since": time.strftime("%Y-%m-%dT%H:%M:%S%z")}) + "\n")
        self._file.flush()

    def check(self) -> None:
        """Raise if the lock file this process holds is no longer ``run_dir/.lock`` (deleted or replaced)."""
        if not self._holds_path():
            raise CheckpointError(f"{self.path} was removed or replaced while this process held it, so another "
                                  "process may be writing this run; stopped before the next commit (resume "
                                  "once the other process has finished)")

    def release(self, *, undo: bool = False) -> None:
        """Unlock; ``undo``: also remove the lock file if this lock created it (a refused command).

        The file is removed while still locked, then unlocked: a process that opened it meanwhile locks it only
        after the removal, and ``__init__`` sees that its file is no longer the path's. Unlocking first would
        let that process lock the file and check it in the moment before the removal, and then share the
        directory with the next process, which creates and locks a new file."""
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
