"""Tables of per-seed values for the results pages: cells written as mean ± std, and paired comparisons with
Holm's correction across a page and the verdict word chosen by rule (``kdcollapse.report._stats``)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from kdcollapse.errors import KdcollapseError
from kdcollapse.report._markdown import markdown_table
from kdcollapse.report._stats import holm, mean_std, paired_t_test, partial_spearman, spearman, verdict


def seeds_cell(values: Sequence[float], digits: int = 2, single_digits: int | None = None) -> str:
    """Per-seed ``values`` as one cell: ``"mean ± std"`` (``mean_std``), a single value as itself (with
    ``single_digits``, default ``digits``), and ``"nan"`` when any value is nan (a mean over seeds would hide it).

    >>> seeds_cell([1.0, 2.0, 3.0], 1), seeds_cell([46.041], 1, 2), seeds_cell([1.0, math.nan])
    ('2.0 ± 1.0', '46.04', 'nan')
    """
    if len(values) == 0:
        raise KdcollapseError("seeds_cell needs at least one value, got none")
    if any(math.isnan(v) for v in values):
        return "nan"
    if len(values) == 1:
        return f"{values[0]:.{single_digits if single_digits is not None else digits}f}"
    return mean_std(values, digits)


def seeds_table(header: Sequence[str], rows: Sequence[tuple[str, Sequence[Sequence[float]]]],
                digits: int | Sequence[int] = 2, single_digits: int | Sequence[int | None] | None = None) -> str:
    """A markdown table whose first column labels the rows and whose other cells are lists of per-seed values,
    each written by ``seeds_cell``; ``digits`` and ``single_digits`` are one number or one per value column."""
    width = len(header) - 1
    per = lambda option: list(option) if isinstance(option, Sequence) else [option] * width  # noqa: E731
    digits, single_digits = per(digits), per(single_digits)
    if len(digits) != width or len(single_digits) != width or any(len(cells) != width for _, cells in rows):
        raise KdcollapseError(f"seeds_table: {width} value columns in the header, but rows or digits differ")
    return markdown_table(header, [[label, *(seeds_cell(v, d, s) for v, d, s in zip(cells, digits, single_digits))]
                                   for label, cells in rows])


def corrected_verdicts(differences: Sequence[float], p_values: Sequence[float], *, alpha: float = 0.05,
                       noise_floors: float | Sequence[float] = 0.0,
                       words: tuple[str, str] | Sequence[tuple[str, str]] = ("better", "worse"),
                       ) -> list[tuple[float, str]]:
    """``(Holm p, verdict)`` of each test, in order: Holm's correction across all of them (nan: no test, left out)
    and the verdict word by :func:`verdict`'s rule with the test's noise floor. ``words`` name a positive and a
    negative difference: ("better", "worse") where higher is better, ("worse", "better") where lower is, ("higher",
    "lower") where neither is. ``noise_floors`` and ``words`` are one for every test or one per test. The one path
    of the study summaries' and :func:`paired_comparisons`' verdicts."""
    n = len(p_values)
    floors = [noise_floors] * n if isinstance(noise_floors, int | float) else list(noise_floors)
    names = [tuple(words)] * n if len(words) and isinstance(words[0], str) else list(words)
    if len(differences) != n or len(floors) != n or len(names) != n:
        raise KdcollapseError(f"corrected_verdicts needs one difference, noise floor and pair of words per test: got "
                              f"{len(differences)}, {len(floors)}, {len(names)} for {n} p-values")
    out = []
    for difference, corrected, floor, (up, down) in zip(differences, holm(p_values), floors, names):
        word = verdict(difference, corrected, alpha=alpha, noise_floor=floor)
        out.append((corrected, {"better": up, "worse": down}.get(word, word)))
    return out


def paired_comparisons(groups: Mapping[str, Mapping[str, Sequence[float]]], pairs: Sequence[tuple[str, str]],
                       metrics: Sequence[str], *, alpha: float = 0.05, noise_floor: float = 0.0,
                       words: tuple[str, str] = ("better", "worse")) -> list[dict]:
    """Paired t-tests of ``a − b`` for every pair and metric, in that order, Holm-corrected across all of them.

    ``groups[g][metric]`` lists a group's per-seed values, in the same seed order for every group (the pairing).
    Each result: ``a``, ``b``, ``metric``, ``difference`` (mean paired difference), ``p``, ``holm_p`` and
    ``verdict`` (``verdict``'s rule; ``words`` replaces "better"/"worse", e.g. ("higher", "lower") for a
    metric that has no better direction).
    """
    tests = []
    for a, b in pairs:
        for metric in metrics:
            difference, p = paired_t_test(groups[a][metric], groups[b][metric])
            tests.append({"a": a, "b": b, "metric": metric, "difference": difference, "p": p})
    for test, (corrected, word) in zip(tests, corrected_verdicts(
            [t["difference"] for t in tests], [t["p"] for t in tests], alpha=alpha, noise_floors=noise_floor,
            words=words)):
        test |= {"holm_p": corrected, "verdict": word}
    return tests


def comparisons_table(tests: Sequence[dict], first: str = "comparison") -> str:
    """The markdown table of ``paired_comparisons``' results: pair, metric, paired difference, Holm p, verdict."""
    return markdown_table([first, "metric", "paired difference", "Holm p", "verdict"],
                          [[f"{t['a']} − {t['b']}", t["metric"], f"{t['difference']:+.4g}", f"{t['holm_p']:.2g}",
                            t["verdict"]] for t in tests])


def rank_correlations(xs: Mapping[str, Sequence[float]], y: Sequence[float],
                      control: Sequence[float] | None = None) -> dict[str, dict]:
    """Spearman's rank correlation of each ``xs[name]`` with ``y`` (the same items in the same order): per name
    ``spearman_rho``, its two-sided ``p`` (:func:`spearman`: exact up to 8 items; uncorrected: descriptive,
    outside a page's Holm family) and
    the number of ``models`` (items). Needs at least 3 items. With ``control`` (a value per item, e.g. its
    parameter count), also ``partial_rho`` and ``partial_p``: the rank correlation controlling for it
    (:func:`partial_spearman`).

    >>> c = rank_correlations({"a": [1.0, 2.0, 3.0, 4.0], "b": [4.0, 3.0, 1.0, 2.0]}, [10.0, 20.0, 30.0, 40.0])
    >>> c["a"]["spearman_rho"], round(c["b"]["spearman_rho"], 12), c["a"]["models"]
    (1.0, -0.8, 4)
    """
    if control is not None and len(control) != len(y):
        raise KdcollapseError(f"rank_correlations: {len(control)} control values for {len(y)} items")
    out = {}
    for name, x in xs.items():
        if len(x) != len(y) or len(y) < 3:
            raise KdcollapseError(f"rank_correlations: {name} has {len(x)} values for {len(y)} items; "
                                  "equal numbers, at least 3, are needed")
        rho, p = spearman(x, y)
        out[name] = {"spearman_rho": rho, "p": p, "models": len(y)}
        if control is not None:
            partial, partial_p = partial_spearman(x, y, control)
            out[name] |= {"partial_rho": partial, "partial_p": partial_p}
    return out


def rank_correlations_table(correlations: Mapping[str, dict], first: str, against: str,
                            control: str | None = None) -> str:
    """The markdown table of ``rank_correlations``: row label, Spearman ρ with ``against`` (and the number of
    items), p (uncorrected)."""
    count = {c["models"] for c in correlations.values()}
    items = f", {count.pop()} items" if len(count) == 1 else ""
    partial = control is not None
    return markdown_table([first, f"Spearman ρ with {against}{items}", "p (uncorrected)",
                           *([f"partial ρ controlling for {control}", "p (uncorrected)"] if partial else [])],
                          [[name, f"{c['spearman_rho']:+.2f}", f"{c['p']:.2g}",
                            *([f"{c['partial_rho']:+.2f}", f"{c['partial_p']:.2g}"] if partial else [])]
                           for name, c in correlations.items()])
