"""Collapse statistics and every metric at vocabulary scale: seconds per million tokens and peak memory.

Each (K, d) runs in a fresh child process (its peak RSS is that case's memory) on synthetic float32
features: Gaussian class means, unit noise, every class present (the first K tokens are 0..K-1, the
rest uniform). Phases, timed separately:

- ``stats``: ``FeatureStatistics.update`` over ``--tokens`` tokens in batches of 4096, reported per 10^6
  tokens (linear in N: the cost per batch is fixed);
- ``metrics``: ``collapse_metrics(stats)``, every metric of the features (NC1, NC2 incl. the tiled
  equiangularity and the ETF error, CDNV in tiles, VCI, GNC1, ...), once;
- ``classifier``: ``collapse_metrics(stats, W)`` minus GNC2, i.e. NC2 of W, NC3, GNC3 (``--gnc2`` adds
  GNC2, screened then exact where the minimum can be, ``min_one_vs_rest_distance``, timed apart);
- ``ncc``: NC4's second pass (``NearestClassMeanAccuracy``) over ``--ncc-tokens`` tokens, per 10^6.

With ``--rhubarbwu`` (and ``neural_collapse`` importable: ``pip install --no-deps`` of
rhubarbwu/neural-collapse) the same inputs go through its accumulators (means; covariance and variance
norms in a second pass) and measures (covariance_ratio, simplex_etf_error, self_duality_error,
variability_cdnv with tile_size=1024, the DecAccumulator). Its ETF errors and CDNV fill K x K float32
grids, so its metric phase runs only where three of them (12 K^2 bytes) fit ``--max-gib``.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_vocab_collapse.py --sizes 32000x576,49152x576
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_vocab_collapse.py --sizes 128256x4096 --accumulate float32

``--accumulate float32`` keeps the K x d class sums (and the metric phase's K x d matrices and tiles) in
float32 (docs/metrics.md, "Float32 accumulation").
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import machine  # noqa: E402

BATCH = 4096


def batches(num_classes: int, dim: int, tokens: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    means = 0.5 * torch.randn(num_classes, dim, generator=g)
    for start in range(0, tokens, BATCH):
        size = min(BATCH, tokens - start)
        labels = torch.randint(0, num_classes, (size,), generator=g)
        covered = torch.arange(start, start + size)
        labels = torch.where(covered < num_classes, covered, labels)
        yield means[labels] + torch.randn(size, dim, generator=g), labels


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def one_case(num_classes: int, dim: int, args) -> dict:
    from kdcollapse.geometry import min_one_vs_rest_distance
    from kdcollapse.metrics import FeatureStatistics, NearestClassMeanAccuracy, collapse_metrics
    import kdcollapse.metrics._collapse as collapse

    torch.set_num_threads(args.threads)
    tokens = max(args.tokens, num_classes)
    out = {"K": num_classes, "d": dim, "tokens": tokens}
    stats = FeatureStatistics(num_classes, dim, sync_on_compute=False, accumulate=args.accumulate)
    out["accumulate"] = stats.accumulate
    warm = FeatureStatistics(num_classes, dim, sync_on_compute=False, accumulate=args.accumulate)  # lazy imports
    warm.update(*next(batches(num_classes, dim, BATCH, seed=3)))
    del warm
    elapsed = 0.0
    for x, y in batches(num_classes, dim, tokens):
        elapsed += timed(lambda: stats.update(x, y))[1]
    out["stats_s_per_M"] = elapsed / tokens * 1e6
    values, out["metrics_s"] = timed(lambda: collapse_metrics(stats))
    weight = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    if not args.gnc2:
        collapse.min_one_vs_rest_distance = lambda w: min_one_vs_rest_distance(w[:2])  # skipped: 2 classes
    full, out["classifier_s"] = timed(lambda: collapse_metrics(stats, weight))
    if args.gnc2:
        gnc2, out["gnc2_s"] = timed(lambda: min_one_vs_rest_distance(weight))
        out["classifier_s"] -= out["gnc2_s"]
        out["gnc2_solved_exactly"] = gnc2.solved.numel()
    means = stats.class_means()
    ncc = NearestClassMeanAccuracy(means, sync_on_compute=False)
    elapsed, count = 0.0, 0
    for x, y in batches(num_classes, dim, args.ncc_tokens, seed=2):
        elapsed += timed(lambda: ncc.update(x, y, x @ weight.float().T))[1]
        count += len(y)
    out["ncc_s_per_M"] = elapsed / count * 1e6
    out["values"] = {k: float(full[k]) for k in ("nc1", "nc2_etf_error", "nc3_self_duality", "cdnv", "vci", "gnc1")}
    out["values"]["ncc_agreement"] = float(ncc.compute()["ncc_agreement"])
    out["peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    if args.rhubarbwu:
        out |= rhubarbwu_case(num_classes, dim, tokens, weight.float(), args)
    return out


def rhubarbwu_case(num_classes: int, dim: int, tokens: int, weight: torch.Tensor, args) -> dict:
    try:
        from neural_collapse.accumulate import CovarAccumulator, DecAccumulator, MeanAccumulator, VarNormAccumulator
        from neural_collapse.measure import (covariance_ratio, self_duality_error, simplex_etf_error,
                                             variability_cdnv)
    except ImportError:
        return {"rhubarbwu": "not installed"}
    out = {}
    MeanAccumulator(num_classes, dim, "cpu").accumulate(*next(batches(num_classes, dim, BATCH, seed=3)))  # warm-up
    mean_acc = MeanAccumulator(num_classes, dim, "cpu")
    elapsed = sum(timed(lambda: mean_acc.accumulate(x, y))[1] for x, y in batches(num_classes, dim, tokens))
    means, m_g = mean_acc.compute()
    var_acc = VarNormAccumulator(num_classes, dim, "cpu", M=means)
    cov_acc = CovarAccumulator(num_classes, dim, "cpu", M=means)
    for x, y in batches(num_classes, dim, tokens):
        elapsed += timed(lambda: (var_acc.accumulate(x, y, means), cov_acc.accumulate(x, y, means)))[1]
    out["rw_stats_s_per_M"] = elapsed / tokens * 1e6
    var_norms, _ = var_acc.compute()
    covariance = cov_acc.compute()
    if 3 * 4 * num_classes**2 > args.max_gib * 2**30:  # its ETF errors and CDNV hold ~3 K x K float32 grids
        return out | {"rhubarbwu_metrics": f"skipped: 3 K x K float32 grids exceed --max-gib {args.max_gib}"}
    start = time.perf_counter()
    values = {"nc1": covariance_ratio(covariance, means, m_g), "nc2_etf_error": simplex_etf_error(means, m_g),
              "nc3_self_duality": self_duality_error(weight, means, m_g),
              "cdnv": variability_cdnv(var_norms, means, tile_size=1024)}
    out["rw_metrics_s"] = time.perf_counter() - start
    dec = DecAccumulator(num_classes, dim, "cpu", M=means, W=weight)
    elapsed, count = 0.0, 0
    for x, y in batches(num_classes, dim, args.ncc_tokens, seed=2):
        elapsed += timed(lambda: dec.accumulate(x, y, weight, means))[1]
        count += len(y)
    out["rw_ncc_s_per_M"] = elapsed / count * 1e6
    _, rates = dec.compute(None, True)
    values["ncc_agreement"] = float(rates)
    out["rw_values"] = {k: float(v) for k, v in values.items()}
    out["rw_peak_rss_gib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="32000x576,49152x576,128256x576,32000x2048,49152x2048,32000x4096",
                        help="comma-separated KxD")
    parser.add_argument("--tokens", type=int, default=65536, help="tokens for the statistics phase")
    parser.add_argument("--ncc-tokens", type=int, default=8192, help="tokens for the NC4 pass")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--gnc2", action="store_true", help="also time the exact GNC2 solver")
    parser.add_argument("--rhubarbwu", action="store_true", help="also time rhubarbwu/neural-collapse")
    parser.add_argument("--max-gib", type=float, default=8.0, help="skip cases whose states exceed this")
    parser.add_argument("--accumulate", choices=("float64", "float32", "auto"), default="float64",
                        help="dtype of the K x d class sums (FeatureStatistics(accumulate=...))")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        k, d = map(int, args.one.split("x"))
        print(json.dumps(one_case(k, d, args)))
        return
    print(machine(torch.device("cpu")), flush=True)
    for size in args.sizes.split(","):
        k, d = map(int, size.split("x"))
        from kdcollapse.metrics import accumulation_dtype

        width = accumulation_dtype(k, d, args.accumulate).itemsize
        need = (2 * k * d * width + 2 * d * d * 8) / 2**30
        if need > args.max_gib:
            print(json.dumps({"K": k, "d": d, "skipped": f"states {need:.1f} GiB > --max-gib"}), flush=True)
            continue
        command = [sys.executable, __file__, "--one", size, *sys.argv[1:]]
        result = subprocess.run(command, capture_output=True, text=True)
        line = result.stdout.strip().splitlines()[-1] if result.returncode == 0 else json.dumps(
            {"K": k, "d": d, "failed": result.stderr.strip().splitlines()[-1:]})
        print(line, flush=True)


if __name__ == "__main__":
    main()
