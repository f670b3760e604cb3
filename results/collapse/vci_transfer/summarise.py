"""Tables, correlations and the Fig. 7-style plot of results/collapse/vci_transfer (reads runs.json).

    python results/collapse/vci_transfer/summarise.py   # writes tables.md and fig7.png next to this file
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

HERE = Path(__file__).parent
METRICS = ("fuzziness", "squared_distance", "cosine_within", "vci")  # NC1 = fuzziness / K: same r
LABELS = {"fuzziness": "Fuzziness", "squared_distance": "Squared distance", "cosine_within": "Cosine similarity",
          "vci": "VCI"}


def pearson(x, y) -> float:
    return float(np.corrcoef(x, y)[0, 1])


def members(rows, family, with_base=False):
    keep = [r for r in rows if r["family"] == family]
    if with_base:  # the lambda family's lambda = 0 point: the tau = 1 run
        keep += [dict(r, member="lambda0", cosine_weight=0.0) for r in rows if r["member"] == "tau1"]
    return keep


def mean_std(values, digits=3):
    if len(values) < 2:
        return f"{values[0]:.{digits}f}"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def correlations(rows, family, with_base=False) -> dict[str, dict]:
    chosen = members(rows, family, with_base)
    seeds = sorted({r["seed"] for r in chosen})
    out = {}
    for m in METRICS:
        per_seed = []
        for s in seeds:
            pts = [r for r in chosen if r["seed"] == s]
            if len(pts) >= 3:
                per_seed.append(pearson([r[m] for r in pts], [r["mlog"] for r in pts]))
        names = sorted({r["member"] for r in chosen})
        avg = lambda key, n: statistics.mean(r[key] for r in chosen if r["member"] == n)  # noqa: E731
        pooled = pearson([avg(m, n) for n in names], [avg("mlog", n) for n in names])
        out[m] = {"per_seed": per_seed, "of_seed_means": pooled}
    return out


def table_rows(rows):
    names = list(dict.fromkeys(r["member"] for r in rows))
    lines = ["| model | seeds | source test acc | fuzziness | squared distance | cosine similarity | VCI | "
             "FMNIST 5-9 | FMNIST 5-9 10-shot | digits | MLOG |", "|" + "---|" * 11]
    for n in names:
        rs = [r for r in rows if r["member"] == n]
        cell = lambda f, d=3: mean_std([f(r) for r in rs], d)  # noqa: E731
        lines.append(f"| {n} | {len(rs)} | {cell(lambda r: 100 * r['source_test_acc'], 2)} | "
                     f"{cell(lambda r: r['fuzziness'])} | {cell(lambda r: r['squared_distance'])} | "
                     f"{cell(lambda r: r['cosine_within'])} | {cell(lambda r: r['vci'])} | "
                     + " | ".join(cell(lambda r, t=t: 100 * r["downstream"][t], 1)
                                  for t in ("fmnist5-9", "fmnist5-9_10shot", "digits"))
                     + f" | {cell(lambda r: r['mlog'])} |")
    return lines


def correlation_lines(rows):
    lines = ["| family | points | " + " | ".join(LABELS[m] for m in METRICS) + " |", "|" + "---|" * 6]
    for family, base, label in (("tau", False, "τ (6 values)"), ("lambda", False, "λ (5 values, τ = 1)"),
                                ("lambda", True, "λ incl. λ = 0 (6 values)")):
        cor = correlations(rows, family, base)
        cells = []
        for m in METRICS:
            c = cor[m]
            pos = sum(v > 0 for v in c["per_seed"])
            cells.append(f"{c['of_seed_means']:+.2f} (per seed {mean_std(c['per_seed'], 2)}; "
                         f"{pos}/{len(c['per_seed'])} > 0)")
        lines.append(f"| {label} | r of seed means | " + " | ".join(cells) + " |")
    return lines


def plot(rows, path):
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    for row, family in enumerate(("tau", "lambda")):
        chosen = members(rows, family)
        for col, m in enumerate(METRICS):
            ax = axes[row, col]
            for s in sorted({r["seed"] for r in chosen}):
                pts = [r for r in chosen if r["seed"] == s]
                ax.scatter([r[m] for r in pts], [r["mlog"] for r in pts], label=f"seed {s}", s=18)
            c = correlations(rows, family)[m]
            ax.set_title(f"{family}: r(seed means) = {c['of_seed_means']:+.2f}")
            ax.set_xlabel(LABELS[m])
            ax.set_ylabel("mean log-odds gain")
    axes[0, 0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    rows = json.loads((HERE / "runs.json").read_text())
    text = ["# Per model (mean ± std over seeds)", "", *table_rows(rows), "",
            "# Pearson r of each metric with MLOG", "", *correlation_lines(rows), ""]
    (HERE / "tables.md").write_text("\n".join(text))
    plot(rows, HERE / "fig7.png")
    print("\n".join(text))


if __name__ == "__main__":
    main()
