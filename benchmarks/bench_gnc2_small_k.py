"""Benchmark: GNC2 and the one-vs-rest distances at the K of image classifiers, this tree against a git revision.

    OMP_NUM_THREADS=1 python benchmarks/bench_gnc2_small_k.py --baseline 63ed885   # results/benchmarks/gnc2_small_k.md

For K <= 32 classes (``_SOLVE_ALL``; all candidates of each other) ``min_one_vs_rest_distance`` solves every
class exactly instead of screening them, and the exact solver starts from the most similar class instead of
150 float32 Frank-Wolfe steps (``kdcollapse/geometry/_distances.py``); K = 33-129 are the rule's other side.
Both functions of this tree and of ``--baseline`` (its ``geometry/_distances.py`` loaded beside this tree's)
run on the same Gaussian classifiers (with and without a common offset) in interleaved rounds in one process:
median wall seconds per call, the ratio, and the largest difference of their answers (both certified to 1e-10).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import interleave, machine, revision_module, timer  # noqa: E402

SIZES = [(10, 16, 0.0), (10, 512, 0.0), (32, 64, 0.0), (32, 512, 1.0), (33, 64, 0.0), (64, 64, 0.0),
         (64, 512, 0.0), (129, 512, 0.0)]


def compare(baseline, num: int, dim: int, offset: float, rounds: int) -> str:
    from kdcollapse.geometry import min_one_vs_rest_distance, nearest_points

    weight = torch.randn(num, dim, generator=torch.Generator().manual_seed(num + dim), dtype=torch.float64) + offset
    calls = {"gnc2": min_one_vs_rest_distance(weight).value,
             "gnc2_base": baseline.min_one_vs_rest_distance(weight).value,
             "dist": nearest_points(weight).distances, "dist_base": baseline.nearest_points(weight).distances}
    times = interleave({
        "gnc2": timer(lambda: min_one_vs_rest_distance(weight)),
        "gnc2_base": timer(lambda: baseline.min_one_vs_rest_distance(weight)),
        "dist": timer(lambda: nearest_points(weight)),
        "dist_base": timer(lambda: baseline.nearest_points(weight))}, rounds)
    gnc2_diff = abs(float(calls["gnc2"] - calls["gnc2_base"]))
    dist_diff = float((calls["dist"] - calls["dist_base"]).abs().max())
    ms = {name: f"{value * 1e3:.1f}" for name, value in times.items()}
    return (f"| {num:,} | {dim} | {offset:g} | {ms['gnc2_base']} | {ms['gnc2']} | "
            f"**{times['gnc2_base'] / times['gnc2']:.2f}×** | {ms['dist_base']} | {ms['dist']} | "
            f"**{times['dist_base'] / times['dist']:.2f}×** | {gnc2_diff:.1e} | {dist_diff:.1e} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", required=True, metavar="REV", help="git revision to compare against")
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds (medians are reported)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="two small sizes, three rounds (a smoke run)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    baseline = revision_module(args.baseline, "geometry/_distances.py")
    sizes, rounds = (SIZES[:2], 3) if args.quick else (SIZES, args.rounds)
    load = os.getloadavg()[0]
    rows = [compare(baseline, *size, rounds) for size in sizes]
    lines = [
        f"Machine: {machine(torch.device('cpu'))}; 1-minute load average {load:.1f} at the start, "
        f"{os.getloadavg()[0]:.1f} at the end.",
        f"Command: `python benchmarks/bench_gnc2_small_k.py {' '.join(sys.argv[1:])}`; median wall ms per call over "
        f"{rounds} interleaved rounds, one process; before = {args.baseline}, now = this tree.",
        "",
        "| K | d | offset | GNC2 before, ms | now, ms | ratio | all K distances before, ms | now, ms | ratio | "
        "GNC2 difference | largest distance difference |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        *rows,
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
