"""Start-up cost of the command line: `kdcollapse --help` and every `kdcollapse COMMAND --help` against
`python -c 'import torch'` (the floor: every command needs torch).

Each round starts one fresh interpreter per case, in an order shuffled per round, and times it wall-clock;
the ratio of a case is its median over the rounds divided by the median of `import torch`. Interleaving
the cases makes the ratios fair on a shared machine. Target (issue 15): every ratio <= 1.2.

    PYTHONPATH=src python benchmarks/bench_cli.py --rounds 15
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time

from _timing import interleave  # benchmarks/_timing.py

COMMANDS = ("demo", "train", "distill", "data", "models", "geometry", "analyze", "plot", "robust-eval")


def cases() -> dict[str, list[str]]:
    runs = {"import torch": [sys.executable, "-c", "import torch"],
            "kdcollapse --help": [sys.executable, "-m", "kdcollapse", "--help"]}
    for command in COMMANDS:
        runs[f"{command} --help"] = [sys.executable, "-m", "kdcollapse", command, "--help"]
    return runs


def wall_seconds(argv: list[str]) -> float:
    start = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, env=os.environ)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    runs = cases()
    for argv in runs.values():  # warm the file cache once
        wall_seconds(argv)
    medians = interleave({name: lambda argv=argv: wall_seconds(argv) for name, argv in runs.items()}, args.rounds,
                         args.seed)
    floor = medians["import torch"]
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}; device: none (start-up only); {args.rounds} interleaved rounds")
    print("| command | median s | ratio to `import torch` |\n|---|---|---|")
    for name, median in medians.items():
        print(f"| `{name}` | {median:.3f} | {median / floor:.2f} |")


if __name__ == "__main__":
    main()
