"""User-facing errors. The CLI prints these as one clear line instead of a traceback."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class KdcollapseError(ValueError):
    """Base class of every error caused by the user's input (config, data, files, arguments)."""


class ConfigError(KdcollapseError):
    """A config key or value is invalid."""


class DataError(KdcollapseError):
    """A dataset is missing, corrupt, or inconsistent with the config."""


class CheckpointError(KdcollapseError):
    """A checkpoint or run directory is missing, corrupt, or belongs to something else."""


def unknown_choice(kind: str, value: object, choices: Iterable[str]) -> str:
    """Message for an unknown name: the bad value, close matches, and every valid choice."""
    choices = sorted(choices)
    close = difflib.get_close_matches(str(value), choices, n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    return f"unknown {kind} {value!r}.{hint} Valid choices: {', '.join(choices)}"
