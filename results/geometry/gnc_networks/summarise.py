"""Tables and the Fig. 2 / Fig. 3-style plots of results/geometry/gnc_networks (reads runs.json).

    python results/geometry/gnc_networks/summarise.py   # writes tables.md, fig2_tau.png, fig3_dim.png here

and, when runs_terminal.json exists (study.py --terminal), the terminal-phase sweeps: their tables in
tables.md, fig2_tau_terminal.png and fig3_dim_terminal.png.
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import matplotlib
from scipy import stats

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kdcollapse.experiments.gnc_networks import BASE_DIM, BASE_TAU, DIMS, TAUS, TERMINAL  # noqa: E402

HERE = Path(__file__).parent

COLUMNS = ("test_acc", "train_acc", "gnc1", "gnc2", "gnc3", "nc1")


def mean_std(values, digits=3):
    if len(values) < 2:
        return f"{values[0]:.{digits}f}" if values else "–"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def select(rows, tau, dim):
    return [r for r in rows if r["tau"] == tau and r["dim"] == dim]


def table(rows, points, label):
    lines = [f"| {label} | seeds | test acc (%) | train acc (%) | GNC1 | GNC2 (one-vs-rest distance) | GNC3 | NC1 | "
             "Thm 3.9 bounds on the optimal GNC2 |", "|" + "---|" * 9]
    for tau, dim in points:
        rs = select(rows, tau, dim)
        if not rs:
            continue
        cells = [mean_std([100 * r[c] if c.endswith("acc") else r[c] for r in rs], 2 if c.endswith("acc") else 3)
                 for c in COLUMNS]
        key = f"{tau:g}" if label == "τ" else f"{dim}"
        lines.append(f"| {key} | {len(rs)} | " + " | ".join(cells)
                     + f" | [{rs[0]['gnc2_lower']:.3f}, {rs[0]['gnc2_upper']:.3f}] |")
    return lines


def paired_extremes(rows, points):
    """For each measure, the smallest-τ run minus the largest-τ run of the same seed: mean ± std and the
    paired t-test p-value (the Fig. 2 claim is that GNC1 and GNC3 fall and GNC2 rises as τ falls)."""
    (lo, dim), (hi, _) = min(points), max(points)
    a = {r["seed"]: r for r in select(rows, lo, dim)}
    b = {r["seed"]: r for r in select(rows, hi, dim)}
    seeds = sorted(set(a) & set(b))
    lines = [f"| τ = {lo:g} − τ = {hi:g}, same seed (n = {len(seeds)}) | mean ± std | paired p |", "|---|---|---|"]
    for c in COLUMNS:
        diffs = [(100 if c.endswith("acc") else 1) * (a[s][c] - b[s][c]) for s in seeds]
        p = stats.ttest_rel([a[s][c] for s in seeds], [b[s][c] for s in seeds]).pvalue if len(seeds) >= 3 else None
        lines.append(f"| {c} | {mean_std(diffs)} | {'–' if p is None else f'{p:.3g}'} |")
    return lines


def curve(ax, rows, points, x_of, key, scale=1.0):
    xs, means, stds = [], [], []
    for tau, dim in points:
        vals = [scale * r[key] for r in select(rows, tau, dim)]
        if vals:
            xs.append(x_of(tau, dim))
            means.append(statistics.mean(vals))
            stds.append(statistics.stdev(vals) if len(vals) > 1 else 0.0)
    ax.errorbar(xs, means, yerr=stds, marker="o", capsize=3, label=key)
    return xs


def plot(rows, points, x_of, xlabel, path, bounds=False):
    fig, axes = plt.subplots(1, 4, figsize=(16, 3.6))
    for ax, key in zip(axes, ("gnc1", "gnc2", "gnc3", "test_acc")):
        xs = curve(ax, rows, points, x_of, key, 100.0 if key == "test_acc" else 1.0)
        if key == "test_acc":
            curve(ax, rows, points, x_of, "train_acc", 100.0)
            ax.legend()
        if bounds and key == "gnc2":
            firsts = [select(rows, t, d)[0] for t, d in points if select(rows, t, d)]
            ax.plot(xs, [r["gnc2_lower"] for r in firsts], "k--", label="Thm 3.9 lower")
            ax.plot(xs, [r["gnc2_upper"] for r in firsts], "k:", label="Thm 3.9 upper")
            ax.legend()
        ax.set_xscale("log")
        ax.minorticks_off()
        ax.set_xticks(xs, [f"{x:g}" for x in xs])
        ax.set_xlabel(xlabel)
        ax.set_title(key)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main():
    rows = json.loads((HERE / "runs.json").read_text())
    tau_points = [(t, BASE_DIM) for t in TAUS]
    dim_points = [(BASE_TAU, d) for d in DIMS]
    text = [f"# vs τ (d = {BASE_DIM}), mean ± std over seeds", "", *table(rows, tau_points, "τ"), "",
            f"# vs d (τ = {BASE_TAU:g}), mean ± std over seeds", "", *table(rows, dim_points, "d"), ""]
    terminal = HERE / "runs_terminal.json"
    if terminal.exists():
        rows_t = json.loads(terminal.read_text())
        text += [f"# vs τ (d = {BASE_DIM}) in the terminal phase ({TERMINAL['epochs']} epochs, gradient norm clipped "
                 f"at {TERMINAL['grad_clip']:g}), mean ± std over seeds", "", *table(rows_t, tau_points, "τ"), "",
                 *paired_extremes(rows_t, tau_points), ""]
        plot(rows_t, tau_points, lambda t, d: t, f"temperature τ (d = {BASE_DIM}, {TERMINAL['epochs']} epochs)",
             HERE / "fig2_tau_terminal.png")
        dim_points_t = [(TERMINAL["tau"], d) for d in DIMS]
        text += [f"# vs d (τ = {TERMINAL['tau']:g}) in the terminal phase, mean ± std over seeds", "",
                 *table(rows_t, dim_points_t, "d"), ""]
        plot(rows_t, dim_points_t, lambda t, d: d, f"feature dimension d (τ = {TERMINAL['tau']:g}, "
             f"{TERMINAL['epochs']} epochs)", HERE / "fig3_dim_terminal.png", bounds=True)
    (HERE / "tables.md").write_text("\n".join(text))
    plot(rows, tau_points, lambda t, d: t, f"temperature τ (d = {BASE_DIM})", HERE / "fig2_tau.png")
    plot(rows, dim_points, lambda t, d: d, f"feature dimension d (τ = {BASE_TAU:g})", HERE / "fig3_dim.png",
         bounds=True)
    print("\n".join(text))


if __name__ == "__main__":
    main()
