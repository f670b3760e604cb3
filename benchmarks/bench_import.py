"""Start-up cost of the library: CPU time (user + system) of `import kdcollapse` and `import kdcollapse.train`
against `import torch` (the floor: the library needs torch), each in a fresh interpreter.

Each round runs every case once, in an order shuffled per round; a case's figure is its median CPU time over
the rounds, its ratio that median over the median of `import torch`, and the range the ratio's spread over
rounds (each round's case time over the same round's `import torch`, min and max). CPU time, not wall time:
on a shared machine a process waiting for a core costs no CPU. Target (issue 42): both ratios <= 1.3.
Also lists the heavy packages each import loads (none of transformers, scipy.signal, matplotlib, torchmetrics).

    PYTHONPATH=src python benchmarks/bench_import.py --rounds 9
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys

from _timing import shared_machine  # benchmarks/_timing.py

CASES = {"import torch": "import torch", "import kdcollapse": "import kdcollapse",
         "import kdcollapse.train": "import kdcollapse.train"}
HEAVY = ("transformers", "scipy.signal", "scipy.linalg", "matplotlib", "torchmetrics", "sklearn", "PIL")
_LOADED = "import sys; {code}; print(' '.join(m for m in {heavy!r} if m in sys.modules) or '-')"


def cpu_seconds(code: str) -> float:
    """User + system CPU seconds of a fresh interpreter running ``code``."""
    pid = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.DEVNULL, env=os.environ).pid
    _, status, usage = os.wait4(pid, 0)
    if status:
        raise SystemExit(f"`{code}` failed (status {status})")
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    if args.rounds < 7:
        parser.error(f"--rounds {args.rounds}: at least 7 rounds")
    load_start = os.getloadavg()[0]
    for code in CASES.values():  # warm the file cache once
        cpu_seconds(code)
    times: dict[str, list[float]] = {name: [] for name in CASES}
    rng = random.Random(args.seed)
    for _ in range(args.rounds):
        order = list(CASES)
        rng.shuffle(order)
        for name in order:
            times[name].append(cpu_seconds(CASES[name]))
    floor = statistics.median(times["import torch"])
    print(shared_machine((load_start, os.getloadavg()[0])) + f"; {args.rounds} interleaved rounds, CPU time")
    print("| import | median CPU s | ratio to `import torch` | per-round range | heavy packages loaded |")
    print("|---|---|---|---|---|")
    for name, code in CASES.items():
        per_round = [t / f for t, f in zip(times[name], times["import torch"])]
        loaded = subprocess.run([sys.executable, "-c", _LOADED.format(code=code, heavy=HEAVY)], check=True,
                                capture_output=True, text=True, env=os.environ).stdout.strip()
        median = statistics.median(times[name])
        print(f"| `{code}` | {median:.2f} | {median / floor:.2f} | {min(per_round):.2f}-{max(per_round):.2f} "
              f"| {loaded} |")


if __name__ == "__main__":
    main()
