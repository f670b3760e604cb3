"""``kdcollapse demo``."""

from __future__ import annotations

from pathlib import Path

from kdcollapse.cli._common import HelpFormatter
from kdcollapse.experiments import demo


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="Teacher, student and distilled students on real data, with a report (minutes on a CPU).",
        description=demo.__doc__, epilog=demo.EXAMPLES, formatter_class=HelpFormatter,
    )
    p.add_argument("--out", default="runs/demo", help="directory for the runs and report.md")
    p.add_argument("--data", choices=sorted(demo.PLANS), help="dataset (default: fashion_mnist if found, else digits)")
    p.set_defaults(func=_main)


def _main(args) -> int:
    demo.run_demo(Path(args.out), args.data)
    return 0
