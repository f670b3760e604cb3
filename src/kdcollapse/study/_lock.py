"""One launch of a study at a time, and one writer of its page at a time. ``kdcollapse study run`` holds
:func:`launch_lock` (an advisory ``flock`` of the study file itself) for the whole launch: a second launch of
the same study is refused with one line before it reads a run, so two launches never train, requeue or record
the same runs. :func:`page_lock` (a ``flock`` of the study file's folder) is held while the page's files
(``runs.json``, ``summary.json``, ``README.md``, the figures) are written, so that two writers (a launch's last
step, ``study report``) write them one after the other, each set whole. The locks are open files, not files
written beside the study: nothing on disk changes, and a killed process's lock ends with it."""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kdcollapse.errors import CheckpointError


@contextmanager
def launch_lock(study_file: str | Path) -> Iterator[None]:
    """Hold the lock of ``study_file`` for the ``with`` body; ``CheckpointError`` if another process holds it."""
    fd = os.open(study_file, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise CheckpointError(f"study {str(study_file)!r} is being run by another process (a `kdcollapse study "
                                  "run` of it holds its lock); wait for that launch to finish: a second one would "
                                  "train the same runs") from None
        yield
    finally:
        os.close(fd)  # closing the only descriptor of the lock releases it


@contextmanager
def page_lock(folder: str | Path) -> Iterator[None]:
    """Hold the lock of the study file's ``folder`` for the ``with`` body, waiting for another writer first."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
