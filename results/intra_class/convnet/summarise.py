"""Tables for results/intra_class/convnet (runs of run.sh): teacher accuracy, soft-label diversity and
feature geometry against λ; student accuracy against λ, "Ours + RKD", and the CE-only student.

    OMP_NUM_THREADS=1 PYTHONPATH=src python results/intra_class/convnet/summarise.py [--runs DIR] [--out DIR]

(--out: where tables.md and runs.json go; this directory by default, teacher3000/ for the runs whose teachers
saw 3,000 images per class.)

Teachers are measured on the run's test subset (300 images per class) in eval mode with the measures of
results/intra_class/analyse_fashion_mnist.py (soft-label spread = mean ‖p(x) − p̄_y‖², p = softmax(z);
d_intra, d_inter on the L2-normalised penultimate features; VCI, NC1). Students: test accuracy after the
last epoch (and validation accuracy); paired differences share the seed (data subset, initialisation).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

from scipy import stats as scipy_stats

HERE = Path(__file__).parent
sys.path.insert(0, str(HERE.parent))
from analyse_fashion_mnist import teacher_measures  # noqa: E402

from kdcollapse.runs import Run, read_metrics  # noqa: E402


def mean_std(values, digits=2):
    if not values:
        return "–"
    if len(values) == 1:
        return f"{values[0]:.{digits}f} (1 seed)"
    return f"{statistics.mean(values):.{digits}f} ± {statistics.stdev(values):.{digits}f}"


def paired(a: dict, b: dict) -> str:
    """mean ± std of a − b over the seeds both have, and a paired t-test p-value (≥ 3 seeds)."""
    seeds = sorted(set(a) & set(b))
    diffs = [a[s] - b[s] for s in seeds]
    if len(diffs) < 3:
        return f"{mean_std(diffs)} (n = {len(diffs)}, no test)"
    p = scipy_stats.ttest_rel([a[s] for s in seeds], [b[s] for s in seeds]).pvalue
    return f"{mean_std(diffs)} (n = {len(diffs)}, p = {p:.3f})"


def finished(path: Path) -> list[Path]:
    """Seed directories whose run logged its last epoch."""
    return sorted(p for p in path.glob("seed*") if (p / "metrics.jsonl").exists()
                  and read_metrics(p)[-1]["epoch"] == Run(p).config.train.epochs)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", default="/work/runs/intra_class_convnet")
    parser.add_argument("--out", default=str(HERE))
    args = parser.parse_args()
    root, out = Path(args.runs), Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = {"teachers": {}, "students": {}}
    for d in sorted(root.glob("teacher_l*")):
        for seed_dir in finished(d):
            run = Run(seed_dir)
            m = teacher_measures(seed_dir, run.dataset("test"))
            m["train_diagnostics"] = {k: v for k, v in read_metrics(seed_dir)[-1].items()
                                      if k in ("gate_fraction", "intra_loss", "pool_size", "d_intra", "d_ratio")}
            rows["teachers"].setdefault(d.name, {})[seed_dir.name] = m
    for d in sorted(root.glob("student_*")):
        for seed_dir in finished(d):
            last = read_metrics(seed_dir)[-1]
            rows["students"].setdefault(d.name, {})[seed_dir.name] = {"test_acc": last["test_acc"],
                                                                      "val_acc": last.get("val_acc")}
    (out / "runs.json").write_text(json.dumps(rows, indent=1))
    lines = ["| teacher λ | seeds | test acc (%) | soft-label spread | d_intra | d_intra/d_inter | VCI | NC1 |",
             "|" + "---|" * 8]
    for name, per in rows["teachers"].items():
        col = lambda k, dg=3: mean_std([v[k] for v in per.values()], dg)  # noqa: E731
        lines.append(f"| {name.removeprefix('teacher_l')} | {len(per)} | {col('test_acc', 2)} | "
                     f"{col('soft_label_spread', 4)} | {col('d_intra')} | {col('d_ratio')} | {col('vci')} | "
                     f"{col('nc1')} |")
    acc = {name: {s: v["test_acc"] for s, v in per.items()} for name, per in rows["students"].items()}
    lines += ["", "| student | seeds | test acc (%) | − CE student (pp) | − KD from λ = 0 teacher (pp) |",
              "|" + "---|" * 5]
    for name, per in acc.items():
        lines.append(f"| {name} | {len(per)} | {mean_std(list(per.values()))} | "
                     f"{paired(per, acc.get('student_ce', {}))} | {paired(per, acc.get('student_kd_l0', {}))} |")
    (out / "tables.md").write_text("\n".join(lines) + "\n")
    plot(rows, acc, out / "lambda.png")
    print("\n".join(lines))


def plot(rows: dict, acc: dict, path: Path) -> None:
    """Teacher soft-label spread and student accuracy against λ (mean ± std over seeds), CE student as a band."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(per_name: dict, prefix: str, value):
        points = sorted((float(name.removeprefix(prefix)), [value(v) for v in per.values()])
                        for name, per in per_name.items() if name.startswith(prefix))
        return ([x for x, _ in points], [statistics.mean(v) for _, v in points],
                [statistics.stdev(v) if len(v) > 1 else 0.0 for _, v in points])

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.6))
    left.errorbar(*series(rows["teachers"], "teacher_l", lambda v: v["soft_label_spread"]), marker="o", capsize=3)
    left.set(xlabel="teacher λ", ylabel="soft-label spread", title="teacher")
    for prefix, label in (("student_kd_l", "KD"), ("student_kdrkd_l", "KD + RKD")):
        right.errorbar(*series(acc, prefix, lambda v: v), marker="o", capsize=3, label=label)
    ce = list(acc.get("student_ce", {}).values())
    if ce:
        mean, std = statistics.mean(ce), statistics.stdev(ce) if len(ce) > 1 else 0.0
        right.axhspan(mean - std, mean + std, color="grey", alpha=0.3, label="CE only (± std)")
    right.set(xlabel="teacher λ", ylabel="student test accuracy (%)", title="student (convnet_small)")
    right.legend()
    for ax in (left, right):
        ax.set_xscale("symlog", linthresh=0.1)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
