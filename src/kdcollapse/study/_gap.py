"""The fraction of the gap to a target closed by each cell of a summary section (a section's ``gap``)::

    gap: {to: teacher, from: ce, metric: test_perplexity, log: true, label: gap to the teacher closed}

Per seed s, for each other cell A of the section, with g = log when ``log`` (a perplexity: g is then the
cross-entropy in nats) and the identity otherwise:

    closed_s(A) = (g(from_s) − g(A_s)) / (g(from_s) − g(to))

``from``: the reference cell, paired by seed (e.g. the cross-entropy-only student of the same shape); ``to``: the
target (the teacher's evaluation, a run of its own such as a ``teacher_lm`` step): its value at seed s, or, when
the target cell has a single run, that run's for every seed (the teacher's evaluation draws no random number).
0 = no better than the reference, 1 = the target reached, < 0 = worse than the reference (not clipped). This is
the "performance gap recovered" of Burns et al. 2023 (Weak-to-Strong Generalization, arXiv:2312.09390),
(P_weak→strong − P_weak)/(P_ceiling − P_weak), with the reference as the weak baseline and the target as the
ceiling; in log space for a perplexity, where a gap of cross-entropy (nats per token) is what training closes.
A cell's row: the seeds it shares with the reference, each seed's fraction and their mean ± std. Read from the
records alone.
"""

from __future__ import annotations

import math
import statistics

from kdcollapse.errors import ConfigError
from kdcollapse.report import seeds_cell
from kdcollapse.study._cells import section_cells
from kdcollapse.study._summary_spec import Measure, check_gap, column, measures

def section_gaps(study, records: dict, spec: dict, section: dict) -> list[dict]:
    """Each cell's fraction of the gap closed (module doc): ``{"cell", "seeds", "per_seed", "mean", "std"}``,
    in the section's cell order; nothing when the target or the reference has no finished run yet."""
    gap, title = section["gap"], section.get("title", "")
    check_gap(gap, title)
    metric = column(measures(spec, section), gap["metric"], title) if "metric" in gap else \
        Measure.parse(spec["metric"], spec["select"])
    cells, shorts = section_cells(study, records, section)
    cells = {label: {s: r for s, r in runs.items() if "diverged" not in r and metric.has(r)}
             for label, runs in cells.items()}
    short = {label: name for name, label in shorts.items()}
    to, reference = (shorts.get(str(gap[k]), str(gap[k])) for k in ("to", "from"))
    for key, label in (("to", to), ("from", reference)):
        if label not in cells and (study.waiting or any(name not in records for name in study.runs)):
            return []  # a cell named by its runs' fields exists once one of them finished (or was chosen)
        if label not in cells:
            raise ConfigError(f"section {title!r}: gap {key!r} {gap[key]!r} is not one of its cells "
                              f"({', '.join(short.get(c, c) for c in cells)})")
    if not cells[to] or not cells[reference]:
        return []
    g = (lambda v: math.log(v) if v > 0 else math.nan) if gap.get("log", False) else (lambda v: v)
    single = next(iter(cells[to].values())) if len(cells[to]) == 1 else None
    out = []
    for label, runs in cells.items():
        if label in (to, reference):
            continue
        per_seed = {}
        for seed in sorted(set(runs) & set(cells[reference])):
            target = cells[to].get(seed, single)
            if target is None:
                continue
            ref, aim = g(metric.of(cells[reference][seed])), g(metric.of(target))
            per_seed[seed] = (ref - g(metric.of(runs[seed]))) / (ref - aim) if ref != aim else math.nan  # nan: no gap
        if per_seed:
            values = list(per_seed.values())
            out.append({"cell": short.get(label, label), "seeds": sorted(per_seed), "per_seed": values,
                        "mean": statistics.mean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0})
    return out


def gap_table(gap: dict, rows: list[dict], metric_label: str) -> tuple[list[str], list[list[str]]]:
    """The header and rows of a section's gap table."""
    digits = gap.get("digits", 3)
    what = f"log {metric_label}" if gap.get("log", False) else metric_label
    label = gap.get("label", f"fraction of the gap from {gap['from']} to {gap['to']} closed")
    header = [f"{label} ({what}; 0 = {gap['from']}, 1 = {gap['to']})", "seeds", "per seed", "mean ± std"]
    return header, [[r["cell"], ",".join(map(str, r["seeds"])), ", ".join(f"{v:+.{digits}f}" for v in r["per_seed"]),
                     seeds_cell(r["per_seed"], digits)] for r in rows]
