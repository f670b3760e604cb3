"""Atomic file writes: a temporary file in the same directory, flushed to disk, then renamed over the
target, so a reader or a crash sees either the old file or the new one, never a torn one."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from safetensors import SafetensorError

from kdcollapse.errors import CheckpointError

TMP_SUFFIX = ".tmp"


def temporary_path(path: Path) -> Path:
    """A new empty file ``.<name>.<random>.tmp`` next to ``path``."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    os.close(fd)
    return Path(tmp)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


@contextmanager
def writing(path: Path, tmp: Path) -> Iterator[Path]:
    """Write ``tmp`` (the body of the ``with``) and flush it to disk; on any failure remove it. A full
    disk or another OS error becomes a :class:`CheckpointError` naming ``path``."""
    try:
        yield tmp
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp (and writers that recreate the file) give 0600
        fsync_file(tmp)
    except (OSError, SafetensorError) as err:
        tmp.unlink(missing_ok=True)
        raise CheckpointError(f"cannot write {path}: {getattr(err, 'strerror', None) or err}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


@contextmanager
def replacing(path: str | Path) -> Iterator[Path]:
    """``with replacing(path) as tmp: <write tmp>`` atomically replaces ``path`` by what was written."""
    path = Path(path)
    with writing(path, temporary_path(path)) as tmp:
        yield tmp
    rename(tmp, path)


def rename(tmp: Path, path: Path) -> None:
    try:
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except OSError as err:
        raise CheckpointError(f"cannot write {path}: {err.strerror or err}") from None


def write_text(path: str | Path, text: str) -> None:
    with replacing(path) as tmp:
        tmp.write_text(text)


def fsync_file(path: Path) -> None:
    with open(path, "rb") as f:
        os.fsync(f.fileno())


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable (a no-op where directories cannot be opened)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def remove_temporaries(run_dir: Path) -> list[Path]:
    """Delete the ``.*.tmp`` files (and folders: distill-lm's ``.student.tmp``, a kill during its save) an
    interrupted write left in ``run_dir``; returns what was removed."""
    stray = sorted(run_dir.glob(f".*{TMP_SUFFIX}"))
    for path in stray:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
    return stray


def write_files(files: dict[Path, str | bytes], check: bool = False) -> list[Path]:
    """The files of ``files`` whose content on disk differs from the given one (text or bytes; a missing file
    differs), in order; unless ``check``, each of them is written (atomically). A generated page's ``--check``:
    nothing is written, the caller reports the returned files as out of date."""
    changed = [path for path, content in files.items() if not path.is_file() or (
        path.read_bytes() if isinstance(content, bytes) else path.read_text()) != content]
    if not check:
        for path in changed:
            if isinstance(files[path], bytes):
                with replacing(path) as tmp:
                    tmp.write_bytes(files[path])
            else:
                write_text(path, files[path])
    return changed
