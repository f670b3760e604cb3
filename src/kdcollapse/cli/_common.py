"""What the command modules share."""

from __future__ import annotations

import argparse
import contextlib
import logging
import sys
from collections.abc import Iterator


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
