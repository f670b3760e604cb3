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
- ``ncc``: NC4's second pass (``NearestClassMeanAccuracy``) over ``--ncc-tokens`` tokens, per 10^6
  (``--ncc-tokens 0``: none, the process ends with the metric phase, whose own peak is then the last one).

With ``--rhubarbwu`` (and ``neural_collapse`` importable: ``pip install --no-deps`` of
rhubarbwu/neural-collapse) the same inputs go through its accumulators (means; covariance and variance
norms in a second pass) and measures (covariance_ratio, simplex_etf_error, self_duality_error,
variability_cdnv with tile_size ``--rhubarbwu-tile``, the DecAccumulator). Its ETF errors and CDNV fill K x K float32
grids, so its metric phase runs only where three of them (12 K^2 bytes) fit ``--max-gib``. Its CDNV costs
O(K^2 d) elementwise (hours of one core at K = 32,000, d >= 2,048): ``--rhubarbwu-cdnv-classes N`` runs it on
the first N classes and scales the time by (K / N)^2 (its tiles all cost the same), the rest in full.

    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_vocab_collapse.py --sizes 32000x576,49152x576
    OMP_NUM_THREADS=1 nice -n 10 python benchmarks/bench_vocab_collapse.py --sizes 128256x4096 --accumulate float32

``--accumulate float32`` keeps the K x d class sums (and the metric phase's K x d matrices and tiles) in
float32 (docs/metrics.md, "Float32 accumulation"); the classifier W is then float32 too.

Cells too large for the CPU budget: ``--sample-tiles N`` runs only N of the upper-triangle tiles of each
pairwise kernel (NC2 equiangularity of the means and of W, CDNV), evenly spread, and reports the measured
time per tile entry and ``*_extrapolated`` = measured phase - sampled tiles + (time per entry) x (entries of
all tiles). Everything else of the phase (the d x d Grams, pseudo-inverses, ETF errors, ...) runs in full,
and the peak memory is that of the full pass (a tile's memory does not depend on how many run).
``--single-call`` skips the features-only ``collapse_metrics(stats)`` call and times only the call with W
(every metric but GNC2). ``--gnc2-blocks B`` times GNC2's screening (the O(K^2 d) part of
``min_one_vs_rest_distance``) on its first B blocks of classes and scales it to all K classes;
``--gnc2-exact SUBSET`` runs GNC2 in full (screening, tightening and exact solve timed apart) and checks it
against the exact solver on SUBSET random classes; with ``--gnc2-weight smollm2-135m`` W is that model's output
embedding (its duplicate directions and GNC2 without them reported too);
``--gnc2-baseline REV`` times GNC2 in full against the solver of git revision REV in the same process;
``--screen-dtype float32`` forces the screening's products to float32 (default: bfloat16 where native);
``--pairwise-baseline REV`` times the class means' NC2 equiangularity and CDNV from one pass over their Gram
tiles against the two passes of revision REV, same process, in the dtype ``--accumulate`` gives:

    OMP_NUM_THREADS=1 python benchmarks/bench_vocab_collapse.py --pairwise-baseline 4484191 --accumulate float32 \
        --sizes 16384x4096

    OMP_NUM_THREADS=1 python benchmarks/bench_vocab_collapse.py --accumulate auto --gnc2-exact 256 --sizes 32000x2048
    OMP_NUM_THREADS=1 python benchmarks/bench_vocab_collapse.py --gnc2-exact 256 --gnc2-weight smollm2-135m \
        --sizes 49152x576
``--statistics-only`` times the statistics phase alone, ours and rhubarbwu's (``--rhubarbwu-batch``), on
the same ``--tokens`` tokens. Every phase reports wall and process CPU seconds (``*_cpu``): on a shared
machine the CPU time is the cost.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _measure import Stopwatch, TileSampler, clocked, peak_gib, reset_peak, timed  # noqa: E402
from _timing import machine, revision_module  # noqa: E402
from _vocab_gnc2 import gnc2_baseline, gnc2_exact, gnc2_screening  # noqa: E402

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


def pairwise_baseline(num_classes: int, dim: int, revision: str, dtype: torch.dtype) -> dict:
    """The class means' tiled pairwise metrics (NC2's equiangularity and CDNV) of this tree,
    ``equiangle_and_cdnv`` (one pass over the Gram tiles), against ``equiangle`` and ``cdnv`` of git
    ``revision`` (two passes), same process, same means (Gaussian rows with an offset, in ``dtype``, centred
    on their mean as ``class_centred`` does): CPU seconds of each and the answers' relative differences."""
    from kdcollapse.metrics._pairwise import equiangle_and_cdnv

    baseline = revision_module(revision, "metrics/_pairwise.py")
    generator = torch.Generator().manual_seed(1)
    means = (torch.randn(num_classes, dim, generator=generator, dtype=torch.float64) + 0.5).to(dtype)
    variances = torch.rand(num_classes, generator=generator, dtype=torch.float64) * dim
    centred = means - (means.sum(0, dtype=torch.float64) / num_classes).to(dtype)
    out = {"K": num_classes, "d": dim, "mode": "pairwise_baseline", "baseline": revision, "dtype": str(dtype)}
    old_angle = clocked(out, "baseline_equiangle_s", lambda: baseline.equiangle(centred))
    old_cdnv = clocked(out, "baseline_cdnv_s", lambda: baseline.cdnv(means, variances))
    new_angle, new_cdnv = clocked(out, "equiangle_and_cdnv_s", lambda: equiangle_and_cdnv(centred, variances))
    before = out["baseline_equiangle_s_cpu"] + out["baseline_cdnv_s_cpu"]
    return out | {"cpu_ratio_baseline_over_new": before / out["equiangle_and_cdnv_s_cpu"],
                  "equiangle_relative_difference": abs(float(new_angle / old_angle) - 1),
                  "cdnv_relative_difference": abs(float(new_cdnv / old_cdnv) - 1)}


def timed_statistics(num_classes: int, dim: int, tokens: int, accumulate: str, out: dict):
    """``FeatureStatistics.update`` over ``tokens`` synthetic tokens in batches, timed into ``out`` (CPU seconds
    per 10^6 tokens as ``stats_*``), after a small warm-up for the lazy imports; returns the statistics."""
    from kdcollapse.metrics import FeatureStatistics

    stats = FeatureStatistics(num_classes, dim, sync_on_compute=False, accumulate=accumulate)
    out["accumulate"] = stats.accumulate
    warm = FeatureStatistics(2, dim, sync_on_compute=False, accumulate=accumulate)  # lazy imports, small K
    warm.update(*next(batches(2, dim, BATCH, seed=3)))
    del warm
    watch = Stopwatch()
    for x, y in batches(num_classes, dim, tokens):
        watch(lambda: stats.update(x, y))
    watch.per_million(out, "stats", tokens)
    return stats


def statistics_case(num_classes: int, dim: int, args) -> dict:
    """The statistics phase alone, ours and rhubarbwu/neural-collapse's, on the same ``--tokens`` tokens in the
    same process: CPU seconds per 10^6 tokens of each and their ratio. Ours: ``FeatureStatistics.update`` in
    batches of 4,096 (``--accumulate``); theirs: ``MeanAccumulator`` over the tokens, then ``VarNormAccumulator``
    and ``CovarAccumulator`` against those means over them again (its two passes, float32), each batch of
    4,096 fed in pieces of ``--rhubarbwu-batch`` tokens (its one-hot (B, K) float32 matrix is the memory)."""
    out = {"K": num_classes, "d": dim, "mode": "statistics", "tokens": args.tokens}
    timed_statistics(num_classes, dim, args.tokens, args.accumulate, out)  # its statistics freed before theirs
    out["peak_rss_ours_gib"] = peak_gib()
    reset_peak()
    out |= rhubarbwu_statistics(num_classes, dim, args.tokens, args)[0]
    if "rw_stats_cpu_per_M" in out:
        out["rw_over_ours_cpu"] = out["rw_stats_cpu_per_M"] / out["stats_cpu_per_M"]
        out["rw_peak_rss_gib"] = peak_gib()
    return out


def one_case(num_classes: int, dim: int, args) -> dict:
    from kdcollapse.geometry import min_one_vs_rest_distance
    from kdcollapse.metrics import NearestClassMeanAccuracy, collapse_metrics
    import kdcollapse.metrics._collapse as collapse
    import kdcollapse.metrics._pairwise as pairwise

    torch.set_num_threads(args.threads)
    screen_dtype = None if args.screen_dtype == "auto" else getattr(torch, args.screen_dtype)
    if args.gnc2_exact:
        return gnc2_exact(num_classes, dim, args.gnc2_exact, screen_dtype, args.gnc2_weight)
    if args.gnc2_baseline:
        return gnc2_baseline(num_classes, dim, args.gnc2_baseline, screen_dtype)
    if args.pairwise_baseline:
        from kdcollapse.metrics import accumulation_dtype

        dtype = accumulation_dtype(num_classes, dim, args.accumulate)
        return pairwise_baseline(num_classes, dim, args.pairwise_baseline, dtype)
    if args.statistics_only:
        return statistics_case(num_classes, dim, args)
    if args.gnc2_only:  # GNC2's screening alone, on a W in the dtype that --accumulate gives
        from kdcollapse.metrics import accumulation_dtype

        out = {"K": num_classes, "d": dim, "accumulate": args.accumulate}
        dtype = accumulation_dtype(num_classes, dim, args.accumulate)
        gnc2_screening(torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(1), dtype=dtype),
                       args.gnc2_blocks, out, screen_dtype)
        return out | {"peak_rss_gib": peak_gib()}
    tokens = max(args.tokens, num_classes)
    out = {"K": num_classes, "d": dim, "tokens": tokens, "ncc_tokens": args.ncc_tokens}
    stats = timed_statistics(num_classes, dim, tokens, args.accumulate, out)
    out["peak_rss_stats_gib"] = peak_gib()
    out["rss_before_metrics_gib"] = reset_peak()  # the metric phase's own peak below (the states are held)
    sampler = TileSampler(pairwise._upper_tiles, args.sample_tiles)
    pairwise._upper_tiles = sampler
    if not args.single_call:
        clocked(out, "metrics_s", lambda: collapse_metrics(stats))
        sampler.report(out, "metrics_s")
    dtype = torch.float32 if stats.accumulate == "float32" else torch.float64
    weight = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(1), dtype=dtype)
    if not args.gnc2:
        collapse.min_one_vs_rest_distance = lambda w: min_one_vs_rest_distance(w[:2])  # skipped: 2 classes
    full = clocked(out, "classifier_s", lambda: collapse_metrics(stats, weight))
    sampler.report(out, "classifier_s")
    out["peak_rss_metrics_gib"] = peak_gib()
    if args.gnc2:
        gnc2, out["gnc2_s"] = timed(lambda: min_one_vs_rest_distance(weight))
        out["classifier_s"] -= out["gnc2_s"]
        out["gnc2_solved_exactly"] = gnc2.solved.numel()
    if args.gnc2_blocks:
        gnc2_screening(weight, args.gnc2_blocks, out)
    out["peak_rss_gib_so_far"] = max(out["peak_rss_stats_gib"], out["peak_rss_metrics_gib"])
    if not args.ncc_tokens:  # no NC4 phase: the process ends with the metric phase
        out["peak_rss_gib"] = out.pop("peak_rss_gib_so_far")
        out["values"] = {k: float(full[k]) for k in ("nc1", "nc2_etf_error", "nc3_self_duality", "cdnv", "vci", "gnc1")}
        return out
    reset_peak()
    head = weight.float()
    weight = None  # free before allocating: NC4 needs float32 logits and the class means, not W or the states
    means = stats.class_means()
    stats = None
    ncc = NearestClassMeanAccuracy(means, sync_on_compute=False)
    del means
    watch, count = Stopwatch(), 0
    for x, y in batches(num_classes, dim, args.ncc_tokens, seed=2):
        watch(lambda: ncc.update(x, y, x @ head.T))
        count += len(y)
    watch.per_million(out, "ncc", count)
    out["values"] = {k: float(full[k]) for k in ("nc1", "nc2_etf_error", "nc3_self_duality", "cdnv", "vci", "gnc1")}
    out["values"]["ncc_agreement"] = float(ncc.compute()["ncc_agreement"])
    out["peak_rss_ncc_gib"] = peak_gib()  # NC4's phase: the class means, their centred copy, W, the logits
    out["peak_rss_gib"] = max(out.pop("peak_rss_gib_so_far"), out["peak_rss_ncc_gib"])
    if args.rhubarbwu:
        out |= rhubarbwu_case(num_classes, dim, tokens, head, args)
    return out


def rhubarbwu_statistics(num_classes: int, dim: int, tokens: int, args):
    """rhubarbwu/neural-collapse's statistics phase over ``tokens`` tokens (its means, then its variance norms
    and covariance against them in a second pass), timed per 10^6 tokens; returns the timings and, unless
    it is not installed, its means, global mean, variance norms and covariance."""
    try:
        from neural_collapse.accumulate import CovarAccumulator, MeanAccumulator, VarNormAccumulator
    except ImportError:
        return {"rhubarbwu": "not installed"}, None
    out = {}
    MeanAccumulator(2, dim, "cpu").accumulate(*next(batches(2, dim, BATCH, seed=3)))  # warm-up, small K
    piece = args.rhubarbwu_batch or BATCH
    mean_acc, watch = MeanAccumulator(num_classes, dim, "cpu"), Stopwatch()
    for x, y in batches(num_classes, dim, tokens):
        for xs, ys in zip(x.split(piece), y.split(piece)):
            watch(lambda: mean_acc.accumulate(xs, ys))
    means, m_g = mean_acc.compute()
    mean_acc = None  # its sums, freed
    var_acc = VarNormAccumulator(num_classes, dim, "cpu", M=means)
    cov_acc = CovarAccumulator(num_classes, dim, "cpu", M=means)
    for x, y in batches(num_classes, dim, tokens):
        for xs, ys in zip(x.split(piece), y.split(piece)):
            watch(lambda: (var_acc.accumulate(xs, ys, means), cov_acc.accumulate(xs, ys, means)))
    watch.per_million(out, "rw_stats", tokens)
    out["rw_tokens"], out["rw_batch"] = tokens, piece
    var_norms, _ = var_acc.compute()
    return out, (means, m_g, var_norms, cov_acc.compute())


def rhubarbwu_case(num_classes: int, dim: int, tokens: int, weight: torch.Tensor, args) -> dict:
    try:
        from neural_collapse.accumulate import DecAccumulator
        from neural_collapse.measure import (covariance_ratio, self_duality_error, simplex_etf_error,
                                             variability_cdnv)
    except ImportError:
        return {"rhubarbwu": "not installed"}
    tokens = args.rhubarbwu_tokens or tokens  # its one-hot K x B products make its statistics phase slow
    out, (means, m_g, var_norms, covariance) = rhubarbwu_statistics(num_classes, dim, tokens, args)
    if args.rhubarbwu_stats_only:
        return out
    if 3 * 4 * num_classes**2 > args.max_gib * 2**30:  # its ETF errors and CDNV hold ~3 K x K float32 grids
        return out | {"rhubarbwu_metrics": f"skipped: 3 K x K float32 grids exceed --max-gib {args.max_gib}"}
    subset = args.rhubarbwu_cdnv_classes if 0 < args.rhubarbwu_cdnv_classes < num_classes else 0
    values = clocked(out, "rw_metrics_s", lambda: {
        "nc1": covariance_ratio(covariance, means, m_g), "nc2_etf_error": simplex_etf_error(means, m_g),
        "nc3_self_duality": self_duality_error(weight, means, m_g),
        **({} if subset else {"cdnv": variability_cdnv(var_norms, means, tile_size=args.rhubarbwu_tile)})})
    if args.rhubarbwu_float64:  # its ETF errors on the same means in float64 (untimed): its float32 default's error
        values["nc2_etf_error_float64"] = simplex_etf_error(means.double(), m_g.double())
        values["nc3_self_duality_float64"] = self_duality_error(weight.double(), means.double(), m_g.double())
    if subset:  # its CDNV grid on the first classes only, the time scaled by the grid's entries (K / n)^2
        values[f"cdnv_first_{subset}"] = clocked(out, "rw_cdnv_subset_s", lambda: variability_cdnv(
            var_norms[:subset], means[:subset], tile_size=args.rhubarbwu_tile))
        scale = (num_classes / subset) ** 2
        out["rw_cdnv_classes"], out["rw_cdnv_scale"] = subset, scale
        out["rw_metrics_s_cpu_extrapolated"] = out["rw_metrics_s_cpu"] + scale * out["rw_cdnv_subset_s_cpu"]
    dec = DecAccumulator(num_classes, dim, "cpu", M=means, W=weight)
    watch, count = Stopwatch(), 0
    for x, y in batches(num_classes, dim, args.ncc_tokens, seed=2):
        watch(lambda: dec.accumulate(x, y, weight, means))
        count += len(y)
    watch.per_million(out, "rw_ncc", count)
    _, rates = dec.compute(None, True)
    values["ncc_agreement"] = float(rates)
    out["rw_values"] = {k: float(v) for k, v in values.items()}
    out["rw_peak_rss_gib"] = peak_gib()
    return out


def feature_pass(tokens: int, args) -> dict:
    """CPU seconds per 10^6 tokens of SmolLM2-135M's forward pass with every hidden state (what ``analyze --lm``
    runs per batch: blocks of 64 tokens, batches of 8), on random token ids; the model's loading not counted."""
    from kdcollapse.lm import load_language_model

    torch.set_num_threads(args.threads)
    model = load_language_model("smollm2-135m").model
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (max(1, tokens // 64), 64), generator=g)
    watch = Stopwatch()
    with torch.inference_mode():
        model(ids[:8], output_hidden_states=True)  # warm-up
        for batch in ids.split(8):
            watch(lambda: model(batch, output_hidden_states=True))
    out = {"model": "smollm2-135m", "feature_pass_tokens": ids.numel()}
    watch.per_million(out, "feature_pass", ids.numel())
    return out | {"peak_rss_gib": peak_gib()}


def estimated_peak_gib(num_classes: int, dim: int, width: int, copies: int = 4) -> float:
    """Peak RSS of one case: torch's baseline, about 4 K x d copies of the class sums' width (the two states and
    W in the metric phase; W in float32, the class means, their centred copy and the inputs' float32 means in
    NC4's), about 20 d x d float64 matrices and the metric phase's chunks (docs/metrics.md)."""
    return 1.4 + (copies * width * num_classes * dim + 20 * 8 * dim * dim + 3 * 8 * 8192 * dim) / 2**30


def available_gib() -> float:
    with open("/proc/meminfo") as meminfo:
        fields = dict(line.split(":", 1) for line in meminfo)
    return int(fields["MemAvailable"].split()[0]) / 2**20


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
    parser.add_argument("--sample-tiles", type=int, default=None,
                        help="run only this many tiles of each pairwise kernel and extrapolate (see above)")
    parser.add_argument("--single-call", action="store_true", help="skip the features-only metric call")
    parser.add_argument("--gnc2-blocks", type=int, default=0, help="time GNC2's screening on this many blocks")
    parser.add_argument("--rhubarbwu-tokens", type=int, default=0, help="tokens for its statistics phase")
    parser.add_argument("--rhubarbwu-tile", type=int, default=1024,
                        help="its variability_cdnv tile_size (its kernel holds two tile x tile x d float32 arrays)")
    parser.add_argument("--rhubarbwu-cdnv-classes", type=int, default=0, metavar="N",
                        help="run its CDNV on the first N classes only and scale its time by (K / N)^2 "
                             "(rw_metrics_s_cpu_extrapolated): its grid costs hours of one core at K >= 32,000")
    parser.add_argument("--rhubarbwu-float64", action="store_true",
                        help="also its ETF errors on the same means in float64 (a K x K float64 grid; not timed)")
    parser.add_argument("--gnc2-exact", type=int, default=0, metavar="SUBSET",
                        help="time GNC2 in full (screening + exact solve) and check it against the exact solver "
                             "on SUBSET random classes")
    parser.add_argument("--gnc2-weight", choices=("gaussian", "smollm2-135m"), default="gaussian",
                        help="with --gnc2-exact: W of Gaussian rows with an offset (gnc2_weight), or the model's "
                             "output embedding (its own K and d; --sizes then only names the case)")
    parser.add_argument("--screen-dtype", choices=("auto", "float32", "bfloat16"), default="auto",
                        help="precision of GNC2's screening products (min_one_vs_rest_distance's screen_dtype)")
    parser.add_argument("--gnc2-only", action="store_true", help="time only GNC2's screening (--gnc2-blocks)")
    parser.add_argument("--rhubarbwu-stats-only", action="store_true", help="time only its statistics phase")
    parser.add_argument("--rhubarbwu-batch", type=int, default=0,
                        help="feed its accumulators each batch of 4,096 in pieces of this many tokens (memory)")
    parser.add_argument("--statistics-only", action="store_true",
                        help="time only the statistics phase, ours and (if installed) rhubarbwu's, on --tokens tokens")
    parser.add_argument("--gnc2-baseline", metavar="REV",
                        help="time GNC2 in full against the solver of git revision REV, same W, same process")
    parser.add_argument("--pairwise-baseline", metavar="REV",
                        help="time the class means' equiangularity and CDNV (one tiled pass) against the two "
                             "passes of git revision REV, same process, in the dtype --accumulate gives")
    parser.add_argument("--feature-pass", type=int, default=0,
                        help="only time SmolLM2-135M's forward pass over this many tokens (the issue's target)")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        k, d = map(int, args.one.split("x"))
        print(json.dumps(one_case(k, d, args)))
        return
    print(machine(torch.device("cpu")), flush=True)
    if args.feature_pass:
        print(json.dumps(feature_pass(args.feature_pass, args)), flush=True)
        return
    for size in args.sizes.split(","):
        k, d = map(int, size.split("x"))
        from kdcollapse.metrics import accumulation_dtype

        width = accumulation_dtype(k, d, args.accumulate).itemsize
        need = estimated_peak_gib(k, d, width, copies=3 if args.gnc2_only or args.gnc2_exact or args.gnc2_baseline
                                  or args.pairwise_baseline
                                  else 4)
        if args.statistics_only:  # ours' two sums and the inputs' means, then theirs' sums, means and inputs' means
            need = 1.0 + max(2 * width + 4, 3 * 4) * k * d / 2**30
        room = min(args.max_gib, available_gib() - 2)
        if need > room:
            print(json.dumps({"K": k, "d": d, "skipped": f"estimated peak {need:.1f} GiB > {room:.1f} GiB "
                              "(--max-gib, or the memory available now less 2 GiB)"}), flush=True)
            continue
        command = [sys.executable, __file__, "--one", size, *sys.argv[1:]]
        result = subprocess.run(command, capture_output=True, text=True)
        line = result.stdout.strip().splitlines()[-1] if result.returncode == 0 else json.dumps(
            {"K": k, "d": d, "failed": result.stderr.strip().splitlines()[-1:]})
        print(line, flush=True)


if __name__ == "__main__":
    main()
