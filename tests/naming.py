"""``raises_naming``: an error checked for what it must name (the bad value, its key, the valid choices), not for
the order of its words, so a reworded message that still names them passes and one that drops one fails."""

from __future__ import annotations

import contextlib

import pytest


@contextlib.contextmanager
def raises_naming(error: type[BaseException], *names: str):
    """``pytest.raises(error)`` whose one-line message contains every string of ``names``."""
    with pytest.raises(error) as info:
        yield info
    message = str(info.value)
    missing = [name for name in names if name not in message]
    assert not missing and "\n" not in message, f"{missing} not named in the one-line message: {message}"
