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
import random
import statistics
import subprocess
import sys
import time

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
    runs, rng = cases(), random.Random(args.seed)
    times: dict[str, list[float]] = {name: [] for name in runs}
    for name, argv in runs.items():  # warm the file cache once
        wall_seconds(argv)
    for _ in range(args.rounds):
        order = list(runs)
        rng.shuffle(order)
        for name in order:
            times[name].append(wall_seconds(runs[name]))
    floor = statistics.median(times["import torch"])
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, python "
          f"{platform.python_version()}; device: none (start-up only); {args.rounds} interleaved rounds")
    print("| command | median s | ratio to `import torch` |\n|---|---|---|")
    for name, values in times.items():
        median = statistics.median(values)
        print(f"| `{name}` | {median:.3f} | {median / floor:.2f} |")


if __name__ == "__main__":
    main()
