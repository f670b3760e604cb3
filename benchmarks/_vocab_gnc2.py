"""bench_vocab_collapse.py's GNC2 cases: the screening alone (scaled from its first blocks), GNC2 in full
checked against the exact solver, a real W's duplicate directions, and the solver against a git revision's."""

from __future__ import annotations

import json
import sys
import time

import torch
from _measure import Stopwatch, clocked, peak_gib
from _timing import revision_module


def gnc2_screening(weight: torch.Tensor, blocks: int, out: dict, screen_dtype: torch.dtype | None = None) -> None:
    """Time ``min_one_vs_rest_distance``'s screening (bounds for every class) on its first ``blocks`` wide blocks,
    and scale by the number of blocks; neither the float32 re-certification of the classes that bfloat16
    bounds leave near the minimum nor the exact solve after it is included."""
    from kdcollapse.geometry import _distances as dist
    from kdcollapse.geometry import _screening

    num_classes, dim = weight.shape
    m = min(dist._CANDIDATES, num_classes - 1)
    size = _screening._wide_block(num_classes)
    rows = dist._UnitRows(weight)
    dtype = screen_dtype or dist._screen_dtype(rows.device)
    low = rows.W32 if dtype == torch.float32 else rows.W32.to(dtype)
    chunks = torch.arange(num_classes).split(size)
    cpu, start = time.process_time(), time.perf_counter()
    for k in chunks[:blocks]:  # the screening loop of min_one_vs_rest_distance (_screening._screen_all)
        _screening._screen_bounds(rows, k, m, low)
    run = min(blocks, len(chunks))
    out["gnc2_blocks"] = f"{run} of {len(chunks)} (block {size}, products in {str(dtype).split('.')[-1]})"
    out["gnc2_screen_s_extrapolated"] = (time.perf_counter() - start) * len(chunks) / run
    out["gnc2_screen_cpu_extrapolated"] = (time.process_time() - cpu) * len(chunks) / run


def gnc2_weight(num_classes: int, dim: int) -> torch.Tensor:
    """GNC2's test classifier: Gaussian rows with a common offset 0.5 N(0, I) (as the K = 4,096 table), float64,
    or float32 where ``accumulate="auto"`` keeps the statistics (and so W) in float32 (K = 128,256, d = 4,096)."""
    from kdcollapse.metrics import accumulation_dtype

    g = torch.Generator().manual_seed(1)
    weight = torch.randn(num_classes, dim, generator=g, dtype=torch.float64)
    weight += 0.5 * torch.randn(dim, generator=g, dtype=torch.float64)
    return weight.to(accumulation_dtype(num_classes, dim, "auto"))


def gnc2_exact(num_classes: int, dim: int, subset: int, screen_dtype: torch.dtype | None = None,
               source: str = "gaussian") -> dict:
    """GNC2 in full (``min_one_vs_rest_distance``: screening of every class, then the exact solver on the classes
    that can attain the minimum, by branch and bound), CPU seconds of the screening and of the rest (W's unit
    rows and the exact solve), and its check against the exact solver (``nearest_points``) on ``subset``
    random classes: every exact distance must lie in that class's screened [lower, upper] and none below
    GNC2. W: ``gnc2_weight``, or with ``source="smollm2-135m"`` that model's output embedding (its K and d)."""
    from kdcollapse.geometry import _distances, min_one_vs_rest_distance, nearest_points

    if source == "gaussian":
        weight = gnc2_weight(num_classes, dim)
    else:
        from kdcollapse.lm import load_language_model

        weight = load_language_model(source).model.get_output_embeddings().weight.detach().clone()
        num_classes, dim = weight.shape
    out = {"K": num_classes, "d": dim, "mode": "gnc2_exact", "weight": source, "weight_dtype": str(weight.dtype)}
    screening, bounds, refining, tighten = Stopwatch(), _distances._screen_all, Stopwatch(), _distances._tighten

    def timed_screening(*args):  # the screening of every class, timed, and how many classes it leaves near
        upper, lower, kept = screening(lambda: bounds(*args))
        out["near_after_screening"] = int((lower <= upper.min() + 1e-10).sum())
        return upper, lower, kept

    def timed_tighten(*args):  # the tightening (when more than one exact block is near), timed
        refining(lambda: tighten(*args))

    _distances._screen_all = timed_screening
    _distances._tighten = timed_tighten
    dtype = screen_dtype or _distances._screen_dtype(torch.device("cpu"))
    try:
        result = clocked(out, "gnc2_s", lambda: min_one_vs_rest_distance(weight, screen_dtype=dtype))
    finally:
        _distances._screen_all, _distances._tighten = bounds, tighten
    solved = result.solved
    out["screen_dtype"] = str(dtype).split(".")[-1]
    out["gnc2_screening_cpu"], out["gnc2_screening_s"] = screening.cpu, screening.wall
    out["gnc2_refining_cpu"], out["gnc2_refining_s"] = refining.cpu, refining.wall
    out["gnc2_rest_cpu"] = out["gnc2_s_cpu"] - screening.cpu - refining.cpu  # W's unit rows and the exact solve
    out["near_after_refining"] = int((result.lower <= result.upper.min() + 1e-10).sum())
    out |= {"gnc2": float(result.value), "gnc2_gap": float(result.gap), "solved_exactly": solved.numel(),
            "screen_upper_min": float(result.upper.min())}
    print(json.dumps(out), file=sys.stderr, flush=True)  # the main result, before the check below
    if source != "gaussian":
        out |= distinct_directions(weight, source)
    others = torch.randperm(num_classes, generator=torch.Generator().manual_seed(2))[:subset]
    check = clocked(out, "subset_exact_s", lambda: nearest_points(weight, classes=others))
    dist = check.distances[others]
    upper, lower = result.upper[others], result.lower[others]
    out |= {"subset": others.numel(), "subset_exact_min": float(dist.min()),
            "subset_max_gap": float(check.gaps[others].max()),
            "subset_below_gnc2": int((dist < result.value - 1e-10).sum()),
            "subset_outside_screen_bounds": int(((dist < lower - 1e-10) | (dist > upper + 1e-10)).sum()),
            "subset_screen_upper_minus_exact_max": float((upper - dist).max()),
            "subset_screen_upper_minus_exact_median": float((upper - dist).median()),
            "subset_exact_minus_screen_lower_max": float((dist - lower).max())}
    return out | {"peak_rss_gib": peak_gib()}


def distinct_directions(weight: torch.Tensor, source: str) -> dict:
    """A real W's duplicate directions (rows equal after normalisation: GNC2 is 0 if any), a few of their groups
    as tokens, and GNC2 of W with one row per distinct direction (CPU seconds)."""
    from kdcollapse.geometry import min_one_vs_rest_distance, unit_rows
    from kdcollapse.lm import load_language_model

    _, inverse, counts = torch.unique(unit_rows(weight), dim=0, return_inverse=True, return_counts=True)
    groups = (counts > 1).nonzero().flatten()
    tokenizer = load_language_model(source).tokenizer
    first = torch.full((len(counts),), len(inverse)).scatter_reduce(0, inverse, torch.arange(len(inverse)), "amin")
    out = {"distinct_directions": len(counts), "duplicate_groups": len(groups),
           "rows_in_duplicate_groups": int(counts[groups].sum()),
           "duplicate_examples": [tokenizer.convert_ids_to_tokens((inverse == g).nonzero().flatten().tolist())
                                  for g in groups[:4]]}
    distinct = clocked(out, "gnc2_distinct_s", lambda: min_one_vs_rest_distance(weight[first.sort().values]))
    return out | {"gnc2_distinct": float(distinct.value), "gnc2_distinct_gap": float(distinct.gap),
                  "gnc2_distinct_solved_exactly": distinct.solved.numel()}


def gnc2_baseline(num_classes: int, dim: int, revision: str, screen_dtype: torch.dtype | None = None) -> dict:
    """``min_one_vs_rest_distance`` of this tree against the one of git ``revision`` (its
    ``geometry/_distances.py`` loaded as a module), in the same process, on ``gnc2_weight``: CPU seconds of
    each and how their answers differ (value, certificate, screened bounds, classes solved)."""
    from kdcollapse.geometry import min_one_vs_rest_distance

    baseline = revision_module(revision, "geometry/_distances.py")
    weight = gnc2_weight(num_classes, dim)
    out = {"K": num_classes, "d": dim, "mode": "gnc2_baseline", "baseline": revision}
    old = clocked(out, "baseline_s", lambda: baseline.min_one_vs_rest_distance(weight))
    new = clocked(out, "gnc2_s", lambda: min_one_vs_rest_distance(weight, screen_dtype=screen_dtype))
    out["screen_dtype"] = str(screen_dtype or "auto").split(".")[-1]
    out["cpu_ratio_baseline_over_new"] = out["baseline_s_cpu"] / out["gnc2_s_cpu"]
    shared = set(old.solved.tolist()) & set(new.solved.tolist())
    return out | {
        "gnc2": float(new.value), "gnc2_baseline": float(old.value), "gnc2_gap": float(new.gap),
        "value_difference": abs(float(new.value) - float(old.value)),
        "upper_max_difference": float((new.upper - old.upper).abs().max()),
        "lower_new_minus_baseline_max": float((new.lower - old.lower).max()),
        "lower_baseline_minus_new_max": float((old.lower - new.lower).max()),
        "solved": new.solved.numel(), "solved_baseline": old.solved.numel(), "solved_both": len(shared),
        "peak_rss_gib": peak_gib()}
