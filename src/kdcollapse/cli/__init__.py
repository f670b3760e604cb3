"""The ``kdcollapse`` command line: a thin shell over the library, one module per command.

Each module ``kdcollapse/cli/<command>.py`` exposes ``register(subparsers)``, which adds its parser(s) and
sets ``func`` to a function of the parsed args returning an exit status. The library never imports from
here.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from kdcollapse import __version__
from kdcollapse._registry import import_modules
from kdcollapse.cli._common import HelpFormatter, console_logging
from kdcollapse.errors import KdcollapseError

# Order is the order in `kdcollapse --help`.
_COMMAND_MODULES = [
    "kdcollapse.cli.demo",
    "kdcollapse.cli.train",
    "kdcollapse.cli.distill_lm",
    "kdcollapse.cli.train_tokenizer",
    "kdcollapse.cli.data",
    "kdcollapse.cli.models",
    "kdcollapse.cli.geometry",
    "kdcollapse.cli.analyze",
    "kdcollapse.cli.robust_eval",
    "kdcollapse.cli.recipes",
    "kdcollapse.cli.study",
]


class UsageError(KdcollapseError):
    """A command line argparse cannot parse (an unknown option, an invalid int or choice)."""


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose errors are one line (``error: kdcollapse train: argument ...``, exit 2 through
    :func:`main`) rather than the usage text and ``SystemExit``; its subcommand parsers are of this class too."""

    def error(self, message: str):
        raise UsageError(f"{self.prog}: {message} (see `{self.prog} --help`)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="kdcollapse",
        description="Knowledge distillation and the geometry of what classifiers learn.",
        formatter_class=HelpFormatter,
        epilog="Run `kdcollapse COMMAND --help` for a command's options and examples.",
    )
    parser.add_argument("--version", action="version", version=f"kdcollapse {__version__}")
    parser.add_argument("--import", metavar="MODULE", action="append", dest="imports", default=[],
                        help="import a module of yours first, so that its register_model / register_dataset / "
                        "register_method entries exist (repeatable; before or after COMMAND)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for module in _COMMAND_MODULES:
        importlib.import_module(module).register(subparsers)
    return parser


def split_imports(argv: list[str]) -> tuple[list[str], list[str]]:
    """``(modules, rest)``: the values of every ``--import MODULE`` / ``--import=MODULE`` in ``argv`` (before
    or after the command) and the other arguments."""
    modules, rest = [], []
    items = iter(argv)
    for item in items:
        if item == "--import":
            value = next(items, None)
            if value is None or value.startswith("-"):
                raise KdcollapseError("--import needs a module name, e.g. --import mymodels")
            modules.append(value)
        elif item.startswith("--import="):
            modules.append(item.partition("=")[2])
        else:
            rest.append(item)
    return modules, rest


def main(argv: list[str] | None = None) -> int:
    try:
        imports, argv = split_imports(sys.argv[1:] if argv is None else list(argv))
        import_modules(imports, "--import")
    except KdcollapseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    parser = build_parser()
    try:
        args, extra = parser.parse_known_args(argv)
        # key=value overrides may come after options (`--overwrite optim.lr=0.1`): argparse leaves those over.
        if extra and hasattr(args, "overrides") and all("=" in e and not e.startswith("-") for e in extra):
            args.overrides = [*args.overrides, *extra]
        elif extra:
            parser.error(f"unrecognized arguments: {' '.join(extra)}")
    except UsageError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    args.imports = imports
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        with console_logging(quiet=getattr(args, "quiet", False)):
            status = int(args.func(args) or 0)
        sys.stdout.flush()  # a reader that has gone (`| head`) shows here, inside the handler below
        return status
    except KdcollapseError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `kdcollapse recipes list | head`: the reader has gone; say nothing more
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # so the exit flush cannot fail again
        return 1
