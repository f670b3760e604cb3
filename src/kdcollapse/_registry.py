"""One registry type behind models, datasets and methods."""

from __future__ import annotations

import contextlib
import fnmatch
import importlib
import os
import re
import sys
from collections.abc import Callable
from typing import Generic, TypeVar

from kdcollapse.errors import KdcollapseError, unknown_choice

T = TypeVar("T")


class Registry(Generic[T]):
    """Name -> entry (a class or factory function), with helpful errors on unknown names."""

    def __init__(self, kind: str):
        self.kind = kind
        self._entries: dict[str, T] = {}

    def register(self, name: str | None = None) -> Callable[[T], T]:
        def decorator(entry: T) -> T:
            key = name or entry.__name__
            if key in self._entries:
                raise KdcollapseError(f"{self.kind} {key!r} is registered twice")
            self._entries[key] = entry
            return entry

        return decorator

    def get(self, name: str) -> T:
        try:
            return self._entries[name]
        except KeyError:
            raise KdcollapseError(unknown_choice(self.kind, name, self._entries)) from None

    def names(self, pattern: str = "*") -> list[str]:
        """Matching names in natural order (resnet8 < resnet14 < resnet110)."""
        return sorted((n for n in self._entries if fnmatch.fnmatchcase(n, pattern)), key=_natural_key)

    @contextlib.contextmanager
    def scratch(self):
        """Within the block, registrations go to a copy of the entries, dropped on exit (a test's mutant
        entries, checked by the registry-driven contracts without staying registered)."""
        saved = self._entries
        self._entries = dict(saved)
        try:
            yield self
        finally:
            self._entries = saved

    def __contains__(self, name: object) -> bool:
        return name in self._entries


_MODULE_NAME = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def import_modules(names: list[str] | tuple[str, ...], source: str = "imports") -> None:
    """Import the user's modules ``names`` (dotted, importable from ``sys.path`` or the current directory,
    which is searched last, as ``python -m`` would) so that their ``register_model`` / ``register_dataset`` /
    ``register_method`` calls run; importing twice is a no-op."""
    for name in names:
        if not isinstance(name, str) or not _MODULE_NAME.fullmatch(name) or name.endswith(".py"):
            raise KdcollapseError(f"{source}: {name!r} is not a module name; give a dotted name such as mymodels "
                                  "or mypackage.models (a file mymodels.py in the current directory or on "
                                  "PYTHONPATH), not a path")
    if names and "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.append(os.getcwd())  # the `kdcollapse` script's own folder is sys.path[0], not the cwd
    for name in names:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as err:
            if err.name and name.startswith(err.name):  # the module itself, not one it imports, is missing
                raise KdcollapseError(
                    f"{source}: cannot import module {name!r}; is its folder on sys.path "
                    "(the current directory, or PYTHONPATH)?"
                ) from None
            raise
        except SyntaxError as err:  # the user's file itself: one line naming where, not a traceback
            raise KdcollapseError(f"{source}: module {name!r} does not compile: {err.msg} ({err.filename}, line "
                                  f"{err.lineno})") from None


def _natural_key(name: str) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]
