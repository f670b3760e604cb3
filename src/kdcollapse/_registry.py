"""One registry type behind models, datasets and methods."""

from __future__ import annotations

import fnmatch
import re
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

    def __contains__(self, name: object) -> bool:
        return name in self._entries


def _natural_key(name: str) -> list:
    return [(0, int(part), "") if part.isdigit() else (1, 0, part) for part in re.split(r"(\d+)", name)]
