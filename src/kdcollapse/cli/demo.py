"""``kdcollapse demo``: teacher, student and distilled students on real data, with a report.

Runs on Fashion-MNIST when its files are found (``apt-get install dataset-fashion-mnist``, or
``kdcollapse data download fashion_mnist``), otherwise on the UCI digits shipped with kdcollapse, and says
which. Every step is an ordinary ``kdcollapse`` run with its own run directory under ``--out``, so any
of them can be inspected, resumed or analysed like a run of your own.
"""

from __future__ import annotations

from pathlib import Path

from kdcollapse.cli._common import HelpFormatter, add_quiet, check_output

EXAMPLES = """examples:
  kdcollapse demo                       # Fashion-MNIST if installed, else digits; writes runs/demo/report.md
  kdcollapse demo --out /tmp/demo --data digits
  kdcollapse demo --quick               # a slow or loaded machine: a shorter teacher, KD only
"""
DATASETS = ("digits", "fashion_mnist")  # the plans of kdcollapse.experiments.demo.PLANS


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo", help="Teacher, student and distilled students on real data, with a report (minutes on a CPU).",
        description=__doc__, epilog=EXAMPLES, formatter_class=HelpFormatter,
    )
    p.add_argument("--out", default="runs/demo", help="directory for the runs and report.md")
    p.add_argument("--data", choices=DATASETS, help="dataset (default: fashion_mnist if found, else digits)")
    p.add_argument("--quick", action="store_true",
                   help="a shorter teacher (where none is committed) and KD only: for a slow machine")
    add_quiet(p, "stage or per-epoch lines")
    p.set_defaults(func=_main)


def _main(args) -> int:
    from kdcollapse.experiments import demo  # the library: imported when the command runs, not for --help

    demo.run_demo(check_output(args.out, "--out", folder=True), args.data, quick=args.quick)
    return 0
