"""A summary's statistics: each section's cell rows (mean ± std over seeds), the choice made on validation
first, paired comparisons over the seeds two cells share, comparisons against a front of cells, correlations
across cells, and the verdict of every comparison with Holm's correction across the whole page
(``kdcollapse.report.corrected_verdicts``)."""

from __future__ import annotations

import fnmatch
import math
import statistics

import numpy as np

from kdcollapse.errors import ConfigError
from kdcollapse.report import (corrected_verdicts, mean_difference_ci, paired_t_test, partial_spearman, pearson,
                               seeds_cell, spearman)
from kdcollapse.study._cells import section_cells
from kdcollapse.study._choice import choose
from kdcollapse.study._spec import Study
from kdcollapse.study._summary_spec import Measure, column, measures

# a − b > 0 and < 0 in words, by which direction is better: where lower is, "better" and "worse" swap; where neither
# is, the sign ("higher", "lower"), shown by the same rule
WORDS = {"higher": ("better", "worse"), "lower": ("worse", "better"), "none": ("higher", "lower")}


def compare_sections(study: Study, records: dict, spec: dict) -> tuple[Measure, list[tuple]]:
    """The page's compared metric and, per section of the checked summary ``spec``, ``(title, cell rows,
    comparisons, correlations)``; each comparison with its Holm-corrected p and verdict over all the page's
    tests, and the digits, unit and label it is shown with (``_digits``, ``_unit``, ``_label``)."""
    metric = Measure.parse(spec["metric"], spec["select"])
    sections = [_section(study, records, section, measures(spec, section), metric, spec["select"])
                for section in spec.get("sections") or []]
    comparisons = [c for _, _, section, _ in sections for c in section]
    ms = [c.pop("_measure") for c in comparisons]
    for c, m, (p, word) in zip(comparisons, ms, corrected_verdicts(  # Holm across the whole page
            [c["mean"] for c in comparisons], [c["p"] for c in comparisons], alpha=spec["alpha"],
            noise_floors=[spec["noise_floor"] if m.noise_floor is None else m.noise_floor for m in ms],
            words=[WORDS[m.better or spec["better"]] for m in ms])):
        c["holm_p"], c["verdict"] = p, word
        c["_digits"], c["_unit"], c["_label"] = m.digits, spec["unit"] if m.unit is None else m.unit, m.label
    return metric, sections


def _value_cell(values: list[float], m: Measure) -> str:
    """A cell of a column: mean ± std over the seeds (:func:`seeds_cell`), or with ``seeds: true`` each seed's
    value."""
    return ", ".join(format(v, f".{m.digits}f") for v in values) if m.seeds else seeds_cell(values, m.digits)


def _section(study: Study, records: dict, section: dict, columns: list[Measure], metric: Measure,
             select: str | None = "val_acc"):
    """``(title, cell rows, comparisons)`` of one section, the choice (on validation) made first."""
    cells, shorts = section_cells(study, records, section)
    broke = {label: {s: r["diverged"]["epoch"] for s, r in runs.items() if "diverged" in r}
             for label, runs in cells.items()}
    cells = {label: {s: r for s, r in runs.items() if "diverged" not in r} for label, runs in cells.items()}
    short = {label: name for name, label in shorts.items()}
    chosen, shared = choose(cells, section["choose"], "best" if select else "last") if "choose" in section \
        else (None, [])
    title = section.get("title", "")
    if chosen is not None:
        title += f" — chosen on validation ({section['choose']['by']}, seeds {','.join(map(str, shared))}): {chosen}"
    rows = [[label + (" (chosen on val)" if label == chosen else ""), ",".join(map(str, sorted(runs))),
             *(_value_cell(v, m) if (v := [m.of(runs[s]) for s in sorted(runs) if m.has(runs[s])]) else "–"
               for m in columns)]
            + ([", ".join(f"seed {s}: N.A.({e})" for s, e in sorted(broke[label].items())) or "–"]
               if any(broke.values()) else [])
            for label, runs in cells.items() if runs or broke[label]]
    pairs = []
    for item in section.get("compare") or []:
        if not isinstance(item, list) or len(item) not in (2, 3):
            raise ConfigError(f"section {title!r}: a comparison is [cell a, cell b] or [cell a, cell b, metric of a "
                              f"column], got {item!r}")
        a, b = (shorts.get(x, x) for x in (str(x).replace("{chosen}", chosen or "{chosen}") for x in item[:2]))
        measure = column(columns, item[2], title) if len(item) == 3 else None
        if a != b and (a, b, measure) not in pairs and a in cells and b in cells:  # a choice may make a pair one cell
            pairs.append((a, b, measure))
    comparisons = [_compare(short.get(a, a), short.get(b, b), cells[a], cells[b], m or metric) | (
        {"measure": m.label} if m else {}) for a, b, m in pairs]
    if "front" in section:
        comparisons += _front(cells, columns, section["front"], title, short)
    correlations = _correlate(cells, columns, section["correlate"], title) if "correlate" in section else []
    return title, rows, comparisons, correlations


def _front(cells: dict, columns: list[Measure], spec, title: str, short: dict) -> list[dict]:
    """Each cell matching ``cells`` against the front of the cells matching ``along``: per seed, the front's ``y`` at
    the cell's ``x``, linearly interpolated between that seed's front points (a seed whose ``x`` lies outside
    their range is left out: no extrapolation); the paired test of the cell's ``y`` minus that, over the seeds
    left (at least 2), for each ``y``. Cells are named by label or short name (globs allowed)."""

    keys = {"cells", "along", "x", "y"}
    if not isinstance(spec, dict) or not keys <= set(spec) <= keys | {"label"} or not isinstance(spec["y"], list):
        raise ConfigError(f"section {title!r}: 'front' is {{cells: GLOB, along: GLOB, x: metric of a column, y: "
                          f"[metrics of columns], label: TEXT}}, got {spec!r}")

    def matching(pattern: str) -> list[str]:
        return [c for c in cells if cells[c] and (fnmatch.fnmatchcase(c, pattern)
                                                  or fnmatch.fnmatchcase(short.get(c, ""), pattern))]

    x, along = column(columns, spec["x"], title), matching(spec["along"])
    out = []
    for cell in (c for c in matching(spec["cells"]) if c not in along):
        for y in (column(columns, name, title) for name in spec["y"]):
            pairs = {}
            for seed, r in cells[cell].items():
                points = sorted((x.of(cells[a][seed]), y.of(cells[a][seed])) for a in along
                                if seed in cells[a] and y.has(cells[a][seed]))
                if y.has(r) and len(points) >= 2 and points[0][0] <= x.of(r) <= points[-1][0]:
                    xs, ys = zip(*points)
                    pairs[seed] = (y.of(r), float(np.interp(x.of(r), xs, ys)))
            if len(pairs) < 2:
                continue  # fewer than two seeds on the front: no test
            seeds = sorted(pairs)
            a, b = [pairs[s][0] for s in seeds], [pairs[s][1] for s in seeds]
            mean, p = paired_t_test(a, b)
            low, high = mean_difference_ci(a, b)
            name = spec.get("label", f"front of {spec['along']}")
            out.append({"a": short.get(cell, cell), "b": f"{name} at its {x.label}", "seeds": seeds,
                        "per_seed": [u - v for u, v in zip(a, b)], "mean": mean, "p": p, "ci": [low, high],
                        "_measure": y, "measure": y.label})
    return out


def _correlate(cells: dict, columns: list[Measure], spec, title: str) -> list[dict]:
    """Pearson's r between each ``x`` column and the ``y`` column across the section's cells: of the cell means,
    and per seed (over the cells that seed finished, at least 3)."""
    if not isinstance(spec, dict) or not {"x", "y"} <= set(spec) <= {"x", "y", "across", "control"} \
            or not isinstance(spec["x"], list) or spec.get("across", "cells") not in ("cells", "runs") \
            or ("control" in spec and spec.get("across") != "runs"):
        raise ConfigError(f"section {title!r}: 'correlate' is {{x: [metrics of columns], y: metric of a column}} "
                          f"(Pearson's r across the cells), or with across: runs (Spearman's ρ across every run of "
                          f"the cells) and optionally control: a column's metric (partial Spearman), got {spec!r}")
    if spec.get("across") == "runs":
        return _rank_correlate(cells, columns, spec, title)
    y = column(columns, spec["y"], title)
    full = {label: runs for label, runs in cells.items() if runs}
    seeds = sorted({s for runs in full.values() for s in runs})
    out = []
    for x in (column(columns, name, title) for name in spec["x"]):
        per_seed = {}
        for seed in seeds:
            points = [runs[seed] for runs in full.values() if seed in runs]
            if len(points) >= 3:
                per_seed[seed] = pearson([x.of(r) for r in points], [y.of(r) for r in points])
        means = [[statistics.mean(m.of(r) for r in runs.values()) for runs in full.values()] for m in (x, y)]
        out.append({"x": x.label, "y": y.label, "cells": len(full),
                    "r_of_means": pearson(*means) if len(full) >= 3 else math.nan, "per_seed": per_seed})
    return out


def _rank_correlate(cells: dict, columns: list[Measure], spec: dict, title: str) -> list[dict]:
    """Spearman's ρ of each ``x`` with ``y`` across every run of the section's cells (each seed of each cell one
    point, e.g. every trained student), and with ``control`` the partial ρ controlling for it (e.g. the
    student's size: :func:`kdcollapse.report.partial_spearman`); descriptive, p uncorrected (exact up to 8 runs:
    :func:`kdcollapse.report.spearman`)."""
    y, control = column(columns, spec["y"], title), column(columns, spec["control"], title) if "control" in spec \
        else None
    out = []
    for x in (column(columns, name, title) for name in spec["x"]):
        runs = [r for c in cells.values() for r in c.values()
                if x.has(r) and y.has(r) and (control is None or control.has(r))]
        xs, ys = [x.of(r) for r in runs], [y.of(r) for r in runs]
        rho, p = spearman(xs, ys)
        row = {"x": x.label, "y": y.label, "runs": len(runs), "spearman_rho": rho, "p": p}
        if control is not None:
            partial, partial_p = partial_spearman(xs, ys, [control.of(r) for r in runs])
            row |= {"control": control.label, "partial_rho": partial, "partial_p": partial_p}
        out.append(row)
    return out


def _compare(a: str, b: str, runs_a: dict, runs_b: dict, metric: Measure) -> dict:
    seeds = sorted(set(runs_a) & set(runs_b))
    x, y = [metric.of(runs_a[s]) for s in seeds], [metric.of(runs_b[s]) for s in seeds]
    mean, p = paired_t_test(x, y) if seeds else (math.nan, math.nan)
    low, high = mean_difference_ci(x, y)
    return {"a": a, "b": b, "seeds": seeds, "per_seed": [u - v for u, v in zip(x, y)], "mean": mean, "p": p,
            "ci": [low, high], "_measure": metric}
