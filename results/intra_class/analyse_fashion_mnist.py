"""Tables and a plot for the Fashion-MNIST intra-class teacher experiment (results/intra_class/fashion_mnist.md).

Reads the runs written by results/intra_class/run_fashion_mnist.sh and, for every teacher, measures on
the whole Fashion-MNIST test set (10,000 images, eval mode): test accuracy, d_intra and d_inter of the
paper's §4.2 on the L2-normalised penultimate features (kdcollapse.methods.intra_class_teacher), VCI and
NC1 of the features (kdcollapse.metrics), and the within-class spread of the soft labels,
mean ‖p(x) − p̄_y‖² with p̄_y the class mean of p = softmax(logits). Students: last-epoch test accuracy.

    OMP_NUM_THREADS=1 PYTHONPATH=src python results/intra_class/analyse_fashion_mnist.py \
        [--runs /work/runs/intra_class/fashion_mnist] [--out results/intra_class]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
from pathlib import Path

import torch

from kdcollapse.data import load_dataset, make_loader
from kdcollapse.metrics import intra_inter_distances
from kdcollapse.metrics.functional import collapse_metrics_from_features
from kdcollapse.runs import load_model, read_metrics

LAMBDAS = ("0", "0.01", "0.03", "0.1", "1")  # 1 is outside the paper's range [0.01, 0.03]
SEEDS = (0, 1, 2)


@torch.no_grad()
def teacher_measures(run_dir: Path, test_set) -> dict[str, float]:
    model, _ = load_model(run_dir)
    model.eval()
    features, logits = [], []
    for x, _ in make_loader(test_set, 1000, train=False, device="cpu", seed=0):
        h = model.forward_features(x)
        features.append(h)
        logits.append(model.forward_head(h))
    h, z, y = torch.cat(features), torch.cat(logits), test_set.labels
    d_intra, d_inter = intra_inter_distances(h, y)
    collapse = collapse_metrics_from_features(h, y, test_set.num_classes)
    p = z.softmax(1).double()
    class_means = torch.zeros(test_set.num_classes, p.shape[1], dtype=torch.float64).index_add_(0, y, p)
    class_means /= torch.bincount(y, minlength=test_set.num_classes)[:, None]
    return {
        "test_acc": 100 * (z.argmax(1) == y).double().mean().item(),
        "d_intra": d_intra, "d_inter": d_inter, "d_ratio": d_intra / d_inter,
        "vci": collapse["vci"].item(), "nc1": collapse["nc1"].item(),
        "soft_label_spread": (p - class_means[y]).square().sum(1).mean().item(),
    }


def last_test_acc(run_dir: Path) -> float:
    return read_metrics(run_dir)[-1]["test_acc"]


def mean_std(values: list[float], digits: int = 3) -> str:
    """mean ± sample standard deviation."""
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=Path, default=Path("/work/runs/intra_class/fashion_mnist"))
    parser.add_argument("--out", type=Path, default=Path("results/intra_class"))
    parser.add_argument("--from-json", action="store_true", help="redo table and plot from fashion_mnist.json")
    args = parser.parse_args()
    if args.from_json:
        summary = json.loads((args.out / "fashion_mnist.json").read_text())
        write_table(summary["rows"], summary["student_ce_acc"], args.out / "fashion_mnist_table.md")
        plot(summary["rows"], summary["student_ce_acc"], args.out / "fashion_mnist.png")
        return
    torch.set_num_threads(1)
    test_set = load_dataset("fashion_mnist", "test")
    rows = []
    for lam in LAMBDAS:
        for seed in SEEDS:
            teacher_dir = args.runs / f"teacher_l{lam}" / f"seed{seed}"
            row = {"lambda": float(lam), "seed": seed, **teacher_measures(teacher_dir, test_set)}
            row |= {f"train_{k}": v for k, v in read_metrics(teacher_dir)[-1].items()
                    if k in ("gate_fraction", "d_intra", "d_inter", "intra_loss", "tuplet_ratio")}
            row["student_acc"] = last_test_acc(args.runs / f"student_l{lam}" / f"seed{seed}")
            rows.append(row)
            print(row, flush=True)
    baseline = [last_test_acc(args.runs / "student_ce" / f"seed{seed}") for seed in SEEDS]
    summary = {"rows": rows, "student_ce_acc": baseline, "machine": platform.platform(),
               "torch": torch.__version__, "seeds": list(SEEDS)}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "fashion_mnist.json").write_text(json.dumps(summary, indent=2) + "\n")
    write_table(rows, baseline, args.out / "fashion_mnist_table.md")
    plot(rows, baseline, args.out / "fashion_mnist.png")


def write_table(rows: list[dict], baseline: list[float], path: Path) -> None:
    columns = [("test_acc", "teacher acc (%)", 2), ("d_intra", "d_intra", 3), ("d_ratio", "d_intra / d_inter", 3),
               ("vci", "VCI", 3), ("nc1", "NC1", 2), ("soft_label_spread", "soft-label spread", 4),
               ("student_acc", "student acc (%)", 2)]
    lines = ["| λ | " + " | ".join(title for _, title, _ in columns) + " | student − λ=0 student (pp) |",
             "|---" * (len(columns) + 2) + "|"]
    reference = {r["seed"]: r["student_acc"] for r in rows if r["lambda"] == 0}
    for lam in LAMBDAS:
        group = [r for r in rows if r["lambda"] == float(lam)]
        cells = [mean_std([r[key] for r in group], digits) for key, _, digits in columns]
        gain = mean_std([r["student_acc"] - reference[r["seed"]] for r in group], 2)
        lines.append(f"| {lam} | " + " | ".join(cells) + f" | {gain} |")
    lines.append(f"| student without teacher (CE) | | | | | | | {mean_std(baseline, 2)} | |")
    path.write_text("\n".join(lines) + "\n")


def plot(rows: list[dict], baseline: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(12, 3.6))
    for ax, key, label in ((axes[0], "d_intra", "teacher d_intra (test set)"),
                           (axes[1], "vci", "teacher VCI (test set)"),
                           (axes[2], "student_acc", "student test accuracy (%)")):
        for seed in SEEDS:
            points = sorted((r["lambda"], r[key]) for r in rows if r["seed"] == seed)
            ax.plot(range(len(points)), [v for _, v in points], "o-", alpha=0.7, label=f"seed {seed}")
        ax.set_xticks(range(len(LAMBDAS)), LAMBDAS)
        ax.set_xlabel("λ (teacher's intra-class weight)")
        ax.set_title(label, fontsize=10)
    axes[2].axhline(statistics.mean(baseline), color="grey", ls="--", label="CE student (mean)")
    axes[2].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
