"""Table and plot for results/collapse/vci_schedules (VCI Fig. 3 at CPU scale) from the runs' metrics.jsonl.

    python results/collapse/vci_schedules/summarise.py [--runs /work/runs/vci_schedules]
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).parent
SCHEDULES = ("step", "cosine", "no_wd")
K = 5
# Logged per epoch by analysis.every; fuzziness = K * NC1. The four metrics of the paper's Fig. 3, then class
# separation (Kornblith et al.) and the test VCI.
METRICS = {"train_vci": "VCI (train)", "train_fuzziness": "fuzziness (train)",
           "train_squared_distance": "squared distance (train)", "train_cosine_within": "within-class cosine distance (train)",
           "train_class_separation": "class separation (train)", "test_vci": "VCI (test)"}


def series(run: Path) -> dict[str, list[float]]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    out = {k: [r[k] for r in records] for k in METRICS if k != "train_fuzziness"}
    out["train_fuzziness"] = [K * r["train_nc1"] for r in records]
    out["test_acc"] = [r["test_acc"] for r in records]
    return out


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="/work/runs/vci_schedules")
    root = Path(parser.parse_args().runs)
    data = {s: [series(p) for p in sorted((root / s).glob("seed*"))] for s in SCHEDULES}
    lines = ["| schedule | seeds | metric | epoch 1 | epoch 20 | epochs where it fell (of 19, mean over seeds) |",
             "|---|---|---|---|---|---|"]
    fig, axes = plt.subplots(2, len(METRICS) // 2, figsize=(4 * len(METRICS) // 2, 6.8))
    axes = axes.flatten()
    for s, runs in data.items():
        for ax, (key, label) in zip(axes, METRICS.items()):
            first = [r[key][0] for r in runs]
            last = [r[key][-1] for r in runs]
            falls = statistics.mean(sum(b < a for a, b in zip(r[key], r[key][1:])) for r in runs)
            ms = lambda v: f"{statistics.mean(v):.3f} ± {statistics.stdev(v):.3f}"  # noqa: E731
            lines.append(f"| {s} | {len(runs)} | {label} | {ms(first)} | {ms(last)} | {falls:.1f} |")
            epochs = range(1, len(runs[0][key]) + 1)
            mean = [statistics.mean(r[key][e] for r in runs) for e in range(len(epochs))]
            ax.plot(epochs, mean, label=s)
            ax.set_title(label)
            ax.set_xlabel("epoch")
        accs = [r["test_acc"][-1] for r in runs]
        lines.append(f"| {s} | {len(runs)} | test accuracy (%) | | {statistics.mean(accs):.2f} ± "
                     f"{statistics.stdev(accs):.2f} | |")
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(HERE / "fig3_schedules.png", dpi=110)
    (HERE / "tables.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
