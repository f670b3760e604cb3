"""Tables of results/geometry/gnc_2d from its runs.json (mean ± std over seeds, and every seed).

    python results/geometry/gnc_2d/summarise.py      # writes tables.md next to this file
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
COLUMNS = {"test_acc": "test acc (%)", "mean_norm_cv": "CV of class-mean norms", "w_norm_cv": "CV of row norms",
           "mean_gap_min": "class means: min gap", "mean_gap_max": "class means: max gap",
           "w_gap_min": "rows: min gap", "w_gap_max": "rows: max gap"}


def fmt(values: list[float], scale: float = 1.0) -> str:
    values = [v * scale for v in values]
    per = ", ".join(f"{v:.2f}" for v in values)
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values):.2f} ({per})"


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
        pairs = [(s, r["seed"], r["pair_angles_deg"]) for s, runs in groups.items() for r in runs if "pair_angles_deg" in r]
        if pairs:
            lines += ["", "| setting | seed | angle between the rows of each similar pair (degrees) |", "|---|---|---|"]
            lines += [f"| {s} | {seed} | {', '.join(f'{a:.0f}' for a in angles)} |" for s, seed, angles in pairs]
        lines.append("")
    (HERE / "tables.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
