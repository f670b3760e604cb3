"""Tables, JSON and figures of the Fashion-MNIST distillation runs (``run_fashion_mnist.sh``).

    PYTHONPATH=src python results/distillation/summarise_fashion_mnist.py RUNS_DIR results/distillation

Reads ``RUNS_DIR/<recipe>/seed<N>/metrics.jsonl``; writes ``fashion_mnist.json``, ``fashion_mnist_tables.md``,
``fashion_mnist_phenomenon.png`` (DHKD paper §3.1: curves per setting, mean over seeds) and
``fashion_mnist_methods.png``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from kdcollapse.config import load_config
from kdcollapse.report import markdown_table, plot_curves
from kdcollapse.runs import read_metrics

TABLE = {"student": "vanilla student (CE only)", "kd": "KD", "dkd": "DKD", "dhkd": "DHKD (global alignment)",
         "ikl_kd": "IKL-KD"}
PHENOMENON = {"student": "CE only", "binarykl_only": "BinaryKL only", "ce_binarykl": "CE + BinaryKL, one head",
              "dhkd": "DHKD (CE head + BinaryKL-Norm head)"}
CURVE_KEYS = ("test_acc", "test_loss", "train_acc", "train_loss")


def finished_runs(root: Path, recipe: str) -> dict[int, list[dict]]:
    """seed -> epoch records of every run of ``recipe`` that reached its last epoch."""
    runs = {}
    for run in sorted((root / recipe).glob("seed*")):
        if not (run / "metrics.jsonl").is_file():
            continue
        records = read_metrics(run)
        if records and len(records) == load_config(run / "config.yaml").train.epochs:
            runs[int(run.name.removeprefix("seed"))] = records
    return runs


def mean_std(values: list[float]) -> str:
    return f"{statistics.mean(values):.2f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:.2f}"


def mean_curve(runs: dict[int, list[dict]]) -> list[dict]:
    """Epoch-wise mean over seeds of the curve keys."""
    return [{"epoch": i + 1, **{k: statistics.mean(r[i][k] for r in runs.values()) for k in CURVE_KEYS}}
            for i in range(min(len(r) for r in runs.values()))]


def main(root: Path, out: Path) -> None:
    summary, rows = {}, []
    for recipe in dict.fromkeys([*TABLE, *PHENOMENON]):
        runs = finished_runs(root, recipe)
        if not runs:
            continue
        best = [max(x["test_acc"] for x in r) for r in runs.values()]
        last = [r[-1]["test_acc"] for r in runs.values()]
        summary[recipe] = {"seeds": list(runs), "best_acc": best, "last_acc": last,
                           "last_test_loss": [r[-1]["test_loss"] for r in runs.values()],
                           "last_train_acc": [r[-1]["train_acc"] for r in runs.values()],
                           "epoch_time_s": [statistics.mean(x["epoch_time_s"] for x in r) for r in runs.values()],
                           "curves": runs}
        if recipe in TABLE:
            rows.append([TABLE[recipe], ",".join(map(str, runs)), mean_std(best), mean_std(last),
                         ", ".join(f"{v:.2f}" for v in last)])
    table = markdown_table(["method", "seeds", "best test acc (%)", "last test acc (%)", "last, per seed"], rows)
    rows31 = [[label, ",".join(map(str, summary[r]["seeds"])), mean_std(summary[r]["best_acc"]),
               mean_std(summary[r]["last_acc"]), mean_std(summary[r]["last_test_loss"]),
               mean_std(summary[r]["last_train_acc"])]
              for r, label in PHENOMENON.items() if r in summary]
    table31 = markdown_table(["setting", "seeds", "best test acc (%)", "last test acc (%)", "last test loss",
                              "last train acc (%)"], rows31)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fashion_mnist.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "fashion_mnist_tables.md").write_text(f"{table}\n\n{table31}\n")
    plot_curves({label: mean_curve(summary[r]["curves"]) for r, label in PHENOMENON.items() if r in summary},
                CURVE_KEYS, out / "fashion_mnist_phenomenon.png",
                title="DHKD §3.1 on Fashion-MNIST: convnet → convnet_small, mean over seeds")
    plot_curves({TABLE[r]: mean_curve(summary[r]["curves"]) for r in TABLE if r in summary},
                ("test_acc", "test_loss"), out / "fashion_mnist_methods.png",
                title="Fashion-MNIST distillation: convnet → convnet_small, mean over seeds")
    print(table, table31, sep="\n\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
