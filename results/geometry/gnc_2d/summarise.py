"""Tables of results/geometry/gnc_2d from its runs.json (mean ± std over seeds, and every seed).

    python results/geometry/gnc_2d/summarise.py      # writes tables.md next to this file
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

from scipy import stats

HERE = Path(__file__).parent
COLUMNS = {"test_acc": "test acc (%)", "mean_norm_cv": "CV of class-mean norms", "w_norm_cv": "CV of row norms",
           "mean_gap_min": "class means: min gap", "mean_gap_max": "class means: max gap",
           "w_gap_min": "rows: min gap", "w_gap_max": "rows: max gap"}


def fmt(values: list[float], scale: float = 1.0) -> str:
    values = [v * scale for v in values]
    per = ", ".join(f"{v:.2f}" for v in values)
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} ({per})"


# Paired comparisons (same seed): Fig. B.1's claim is that the sphere spreads the classes evenly (gaps near 1)
# where weight decay does not; Fig. B.6's that putting similar pairs on opposite corners costs accuracy.
COMPARISONS = {"b1": [("sc", "wd", k) for k in ("test_acc", "mean_gap_min", "mean_gap_max", "w_gap_min", "w_gap_max")],
               "b6": [("opposite", "adjacent", "test_acc"), ("learned", "adjacent", "test_acc"),
                      ("learned", "opposite", "test_acc")]}


def paired(groups: dict[str, list[dict]], a: str, b: str, key: str) -> str:
    """``a − b`` over the seeds both settings have: mean ± std, each seed, and the paired t-test p-value."""
    x, y = ({r["seed"]: r[key] for r in groups.get(s, [])} for s in (a, b))
    seeds = sorted(set(x) & set(y))
    if len(seeds) < 2:
        return f"| {a} − {b} | {COLUMNS[key]} | – | – |"
    scale = 100 if key == "test_acc" else 1
    p = stats.ttest_rel([x[s] for s in seeds], [y[s] for s in seeds]).pvalue
    return (f"| {a} − {b} | {COLUMNS[key]} | {fmt([x[s] - y[s] for s in seeds], scale)} | "
            f"{p:.3f} (n = {len(seeds)}) |")


def main() -> None:
    rows = json.loads((HERE / "runs.json").read_text())
    lines = []
    for figure in ("b1", "b6"):
        groups: dict[str, list[dict]] = {}
        for r in sorted((r for r in rows if r["figure"] == figure), key=lambda r: r["seed"]):
            groups.setdefault(r["setting"], []).append(r)
        lines += [f"### Fig. {figure.upper()}", "", "| setting | seeds | " + " | ".join(COLUMNS.values()) + " |",
                  "|---" * (len(COLUMNS) + 2) + "|"]
        for setting, runs in groups.items():
            cells = [fmt([r[k] for r in runs], 100 if k == "test_acc" else 1) for k in COLUMNS]
            lines.append(f"| {setting} | {','.join(str(r['seed']) for r in runs)} | " + " | ".join(cells) + " |")
        lines += ["", "| paired difference | measure | mean ± std (each seed) | paired t-test p |",
                  "|---|---|---|---|"]
        lines += [paired(groups, a, b, key) for a, b, key in COMPARISONS[figure]]
        pairs = [(s, r["seed"], r["pair_angles_deg"])
                 for s, runs in groups.items() for r in runs if "pair_angles_deg" in r]
        if pairs:
            lines += ["", "| setting | seed | angle between the rows of each similar pair (degrees) |", "|---|---|---|"]
            lines += [f"| {s} | {seed} | {', '.join(f'{a:.0f}' for a in angles)} |" for s, seed, angles in pairs]
        lines.append("")
    (HERE / "tables.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
