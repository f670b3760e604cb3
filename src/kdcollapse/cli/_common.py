"""What the command modules share."""

from __future__ import annotations

import argparse
import contextlib
import logging
import math
import os
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """Keeps the examples in epilogs as written and shows defaults, but not an empty one (None, False, [])."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        empty = action.default is None or action.default is False or action.default == []
        if empty or action.default is argparse.SUPPRESS:
            return action.help
        return super()._get_help_string(action)


@contextlib.contextmanager
def console_logging(quiet: bool = False) -> Iterator[None]:
    """Show the library's log lines (per-epoch lines, demo stages: INFO and above) on stderr while a
    command runs; ``quiet`` shows warnings and errors only. The handler is removed afterwards, so calling
    :func:`kdcollapse.cli.main` from a program leaves that program's logging as it was."""
    logger = logging.getLogger("kdcollapse")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(message)s"))
    handler.setLevel(logging.WARNING if quiet else logging.INFO)
    level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def add_quiet(parser: argparse.ArgumentParser, what: str) -> None:
    """The ``--quiet`` option of the commands that train."""
    parser.add_argument("--quiet", action="store_true", help=f"print only the results: no {what}")


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be an integer >= {low}, got {text!r}")
        return value

    parse.__name__ = f"int >= {low}"
    return parse


positive_int = _int_at_least(1)  # argparse types: a bad value is a one-line usage error naming it
non_negative_int = _int_at_least(0)


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}") from None
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}")
    return value


def non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"must be a finite number >= 0, got {text!r}")
    return value


FIGURE_SUFFIXES = (".png", ".pdf", ".svg", ".jpg", ".jpeg", ".eps", ".ps", ".tif", ".tiff", ".webp")


def check_output(path: str | Path, option: str, *, folder: bool = False, suffixes: tuple[str, ...] = ()) -> Path:
    """``path`` as an output of a command, checked before any work: its suffix (one of ``suffixes``), that it
    is a folder (``folder``) or a file as asked when it exists, and that the nearest existing folder above it
    takes a new file (a probe created and removed there). Raises a one-line ``ConfigError``."""
    from kdcollapse.errors import ConfigError

    path = Path(path)
    if suffixes and path.suffix.lower() not in suffixes:
        raise ConfigError(f"{option} {path}: the file name must end in one of {', '.join(suffixes)}")
    if path.exists() and path.is_dir() != folder:
        kind = "a folder" if folder else "a file"
        raise ConfigError(f"{option} {path} exists and is not {kind}; give {kind} path")
    base = path if folder and path.exists() else path.parent
    while not base.exists() and base != base.parent:
        base = base.parent
    if not base.is_dir():
        raise ConfigError(f"{option} {path}: {base} is a file, not a folder")
    try:
        fd, probe = tempfile.mkstemp(prefix=".kdcollapse-probe-", dir=base)
        os.close(fd)
        os.unlink(probe)
    except OSError as err:
        raise ConfigError(f"{option} {path}: cannot write in {base} ({err.strerror or err})") from None
    return path
