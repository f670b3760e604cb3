"""Benchmark: ``FeatureStatistics.compute()`` of this tree against the pairwise pass of git revisions.

    OMP_NUM_THREADS=1 python benchmarks/bench_metrics_compute.py --baseline cb13b29 --baseline 49ac976
    OMP_NUM_THREADS=1 python benchmarks/bench_metrics_compute.py --sizes 50000x256 --rounds 1  # this tree alone
    # results/benchmarks/bench_metrics.md, "compute() against cb13b29" and "compute() at K = 50,000"

``compute()`` (every collapse metric without a classifier) runs on the same float64 statistics with the tiled
pass over the class means' Gram tiles (``metrics/_pairwise.py``) of this tree and of each ``--baseline``
(its ``_pairwise.py`` loaded beside this tree's and put in place of ``class_mean_kernels``; a revision older
than the hyperspherical kernels has ``equiangle_and_cdnv`` only, so it computes NC2's equiangularity and CDNV
and none of the ``nc2g_*`` means and variances). Interleaved rounds in one process, CPU seconds of one thread
(``time.process_time``; the machine is shared, so wall time of one run says little): medians, the ratio of
each baseline to this tree, and the largest relative difference of the metrics both compute. Memory: the
resident memory once the statistics exist and the peak above it during this tree's first ``compute()``
(Linux's VmHWM, reset before it; the other variants run after it).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import cpu_model, interleave, revision_module  # noqa: E402
from bench_vocab_collapse import peak_gib, reset_peak  # noqa: E402


def statistics(num_classes: int, dim: int, per_class: int, seed: int = 0):
    """Float64 statistics of Gaussian classes (means N(0, I), noise 0.3 N(0, I)), ``per_class`` features each."""
    from kdcollapse.metrics import FeatureStatistics

    g = torch.Generator().manual_seed(seed)
    means = torch.randn(num_classes, dim, generator=g)
    stats = FeatureStatistics(num_classes, dim, sync_on_compute=False)
    labels = torch.arange(num_classes)
    for _ in range(per_class):
        stats.update(means + 0.3 * torch.randn(num_classes, dim, generator=g), labels)
    return stats


def pass_of(module):
    """``class_mean_kernels`` of a ``_pairwise`` module, or its ``equiangle_and_cdnv`` as a dict if it has none."""
    if hasattr(module, "class_mean_kernels"):
        return module.class_mean_kernels

    def older(centred, variances, tile):
        equiangle, cdnv = module.equiangle_and_cdnv(centred, variances, tile)
        return {"nc2_equiangle": equiangle, "cdnv": cdnv}
    return older


def compute_with(kernels):
    """``compute()`` (uncached: ``metrics_from_statistics``) with ``kernels`` as its pairwise pass."""
    import kdcollapse.metrics._collapse as collapse

    def run(stats):
        saved, collapse.class_mean_kernels = collapse.class_mean_kernels, kernels
        try:
            return collapse.metrics_from_statistics(stats)
        finally:
            collapse.class_mean_kernels = saved
    return run


def cpu_timer(fn, stats):
    def run() -> float:
        start = time.process_time()
        fn(stats)
        return time.process_time() - start
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", action="append", default=[], metavar="REV",
                        help="git revision whose metrics/_pairwise.py is the baseline (repeatable)")
    parser.add_argument("--sizes", default="5000x256,10000x256", help="KxD cases, comma separated")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians are reported)")
    parser.add_argument("--per-class", type=int, default=2, help="features per class in the statistics")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    import kdcollapse.metrics._pairwise as pairwise

    variants = {"this tree": compute_with(pairwise.class_mean_kernels)}
    for revision in args.baseline:
        variants[revision] = compute_with(pass_of(revision_module(revision, "metrics/_pairwise.py")))
    print(f"CPU: {cpu_model()}, capability {torch.backends.cpu.get_cpu_capability()}, "
          f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load {os.getloadavg()[0]:.1f}; "
          f"{args.rounds} interleaved rounds, median CPU s of compute()")
    names = list(variants)
    print("| K | d | " + " | ".join(names) + " | " + "".join(f"{n} / this tree | " for n in names[1:])
          + "largest relative difference | resident with the statistics, GiB | compute()'s peak above it, GiB |")
    print("|---:|---:|" + "---:|" * (2 * len(names) - 1) + "---:|---:|---:|")
    for size in args.sizes.split(","):
        num_classes, dim = (int(v) for v in size.lower().split("x"))
        stats = statistics(num_classes, dim, args.per_class)
        resident = reset_peak()
        values = {"this tree": variants["this tree"](stats)}
        peak = peak_gib() - resident if resident is not None else float("nan")
        values |= {name: fn(stats) for name, fn in variants.items() if name != "this tree"}  # warm-ups
        mine = values["this tree"]
        worst = max((float(((v - mine[k]) / mine[k]).abs()) for name in names[1:] for k, v in values[name].items()
                     if torch.isfinite(mine[k]) and float(mine[k]) != 0), default=float("nan"))
        times = interleave({name: cpu_timer(fn, stats) for name, fn in variants.items()}, args.rounds)
        print(f"| {num_classes:,} | {dim} | " + " | ".join(f"{times[n]:.2f}" for n in names) + " | "
              + "".join(f"**{times[n] / times['this tree']:.2f}×** | " for n in names[1:]) + f"{worst:.1e} | "
              f"{(resident or float('nan')):.2f} | {peak:.2f} |", flush=True)


if __name__ == "__main__":
    main()
