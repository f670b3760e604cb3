"""Summarise the Fashion-MNIST robustness comparison (natural training vs TRADES vs IKL-AT).

Reads the run directories ``RUNS/fmnist_<method>/seed<N>`` written by ``kdcollapse train`` with the
recipes ``configs/adversarial/fashion_mnist_*.yaml`` and evaluated by ``kdcollapse robust-eval``
(PGD-20 on the full test set, AutoAttack standard on the first 500 test images), and writes
``fashion_mnist.json``, ``fashion_mnist_results.md`` (tables) and two figures into ``--out``.

    PYTHONPATH=src python results/adversarial/summarise_fashion_mnist.py --runs /work/runs/adversarial \\
        --out results/adversarial
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kdcollapse.report import markdown_table  # noqa: E402
from kdcollapse.runs import read_metrics  # noqa: E402

METHODS = {"natural": "natural training", "trades": "TRADES", "ikl_at": "IKL-AT"}
PGD, AA = "pgd-20 Linf eps=0.1 last", "autoattack-standard Linf eps=0.1 last"


def collect(root: Path) -> list[dict]:
    rows = []
    for method in METHODS:
        for run in sorted((root / f"fmnist_{method}").glob("seed*")):
            evals = json.loads((run / "robust_eval.json").read_text()) if (run / "robust_eval.json").exists() else {}
            metrics = read_metrics(run)
            pgd, aa = evals.get(PGD), evals.get(AA)
            rows.append({
                "method": method, "seed": int(run.name[4:]), "run": str(run), "epochs": len(metrics),
                "train_minutes": sum(r["epoch_time_s"] for r in metrics) / 60,
                "clean": 100 * pgd["clean_accuracy"] if pgd else None,
                "pgd20": 100 * pgd["robust_accuracy"] if pgd else None,
                "clean_500": 100 * aa["clean_accuracy"] if aa else None,
                "aa_500": 100 * aa["robust_accuracy"] if aa else None,
                "aa_stages": aa["stages"] if aa else None, "pgd_stages": pgd["stages"] if pgd else None,
                "metrics": metrics,
            })
    return rows


def mean_std(values: list[float | None]) -> str:
    values = [v for v in values if v is not None]
    if not values:
        return "–"
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {spread:.2f}"


def fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


def write(rows: list[dict], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    keys = ("clean", "pgd20", "clean_500", "aa_500")
    summary = {m: {k: mean_std([r[k] for r in rows if r["method"] == m]) for k in keys} for m in METHODS}
    per_run = [{k: v for k, v in r.items() if k != "metrics"} for r in rows]
    (out / "fashion_mnist.json").write_text(json.dumps({"summary": summary, "runs": per_run}, indent=2) + "\n")

    header = ["method", "clean (10 000)", "PGD-20 (10 000)", "clean (first 500)", "AutoAttack (first 500)"]
    text = ["## Mean ± std over seeds (accuracy, %)", "",
            markdown_table(header, [[METHODS[m], *(summary[m][k] for k in keys)] for m in METHODS]),
            "## Every run", "",
            markdown_table(["method", "seed", "epochs", "training (min)", *header[1:]],
                           [[METHODS[r["method"]], r["seed"], r["epochs"], f"{r['train_minutes']:.1f}",
                             *(fmt(r[k]) for k in keys)] for r in rows]),
            "## AutoAttack per attack (first 500 test images; robust accuracy after each attack, %)", ""]
    stage_rows = []
    for r in rows:
        if r["aa_stages"]:
            stage_rows.append([METHODS[r["method"]], r["seed"], fmt(r["clean_500"]),
                               *(f"{100 * s['robust_accuracy']:.2f} ({s['images_per_second']:.1f} img/s)"
                                 for s in r["aa_stages"])])
    text.append(markdown_table(["method", "seed", "clean", "APGD-CE", "APGD-T", "FAB-T", "Square"], stage_rows)
                if stage_rows else "(not evaluated yet)\n")
    (out / "fashion_mnist_results.md").write_text("\n".join(text))

    plot_training(rows, out / "fashion_mnist_curves.png")
    fig, ax = plt.subplots(figsize=(6.4, 3.6))
    width = 0.25
    for i, (key, label) in enumerate((("clean", "clean"), ("pgd20", "PGD-20"), ("aa_500", "AutoAttack (500)"))):
        means = [statistics.mean([r[key] for r in rows if r["method"] == m and r[key] is not None] or [0])
                 for m in METHODS]
        ax.bar([j + (i - 1) * width for j in range(len(METHODS))], means, width, label=label)
    ax.set_xticks(range(len(METHODS)), list(METHODS.values()))
    ax.set_ylabel("accuracy (%)")
    ax.set_title("Fashion-MNIST, L∞ ε = 0.1, mean over seeds")
    ax.legend(fontsize=8)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(out / "fashion_mnist_accuracy.png", dpi=120)
    plt.close(fig)


def plot_training(rows: list[dict], path: Path) -> None:
    """Clean test accuracy and accuracy on the training adversarial examples per epoch; one colour per
    method, one line style per seed."""
    colors = dict(zip(METHODS, ("tab:gray", "tab:blue", "tab:red")))
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for ax, key, title in zip(axes, ("test_acc", "train_adv_acc"),
                              ("clean test accuracy (%)", "accuracy on training adversarial examples (%)")):
        for r in rows:
            points = [(m["epoch"], m[key]) for m in r["metrics"] if key in m]
            if points:
                ax.plot(*zip(*points), marker="o", markersize=3, color=colors[r["method"]],
                        linestyle="-" if r["seed"] == 0 else "--", label=f"{METHODS[r['method']]}, seed {r['seed']}")
        ax.set_xlabel("epoch")
        ax.set_title(title, fontsize=10)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("Fashion-MNIST, convnet_small, L∞ ε = 0.1", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=Path("/work/runs/adversarial"))
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)  # beside this script
    args = parser.parse_args()
    write(collect(args.runs), args.out)
    print(f"wrote {args.out}/fashion_mnist.json, fashion_mnist_results.md and two figures")


if __name__ == "__main__":
    main()
