"""Tables of the DHKD ablation (``run.sh``): each row's accuracy, and each component's paired difference.

    PYTHONPATH=src python results/distillation/dhkd_ablation/summarise.py RUNS results/distillation/dhkd_ablation

Reads ``RUNS/dhkd_ablation/k<K>/<row>/seed<N>/`` (finished runs only); writes ``tables.md`` and
``summary.json``; each run read at its best-validation epoch and at its last epoch.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from study import ablation_tables, paired_row, runs_of, write_tables  # noqa: E402  (results/distillation/study.py)

from kdcollapse.report import markdown_table, mean_std

ROWS = {"ce": "CE only (the student alone)", "kd": "KD (one head)", "bkl_only": "BinaryKL only (one head)",
        "ce_bkl": "CE+BinaryKL (one head)", "dual": "dual (CE on g, BinaryKL-Norm on g′, no alignment)",
        "dual_align": "dual+align (DHKD, the recipe)", "dual_align_mlp": "dual+align+mlp (nonlinear g′)",
        "dual_align_bkl": "dual+align+BinaryKL (plain BinaryKL on g′, τ = 2)",
        "dual_kd": "dual+KD (KL on g′, Table 12)",
        **{f"dual_align_bkl_t{t}": f"dual+align+BinaryKL (plain BinaryKL on g′, τ = {t})"
           for t in (0.25, 0.5, 1, 4, 8)}}
TAUS = {t: f"dual_align_bkl_t{t}" for t in (0.25, 0.5, 1, 4, 8)} | {2: "dual_align_bkl"}  # τ -> row
TAUS = dict(sorted(TAUS.items()))
STEPS = (("dual", "ce_bkl"), ("dual_align", "dual"), ("dual_align_mlp", "dual_align"),
         ("dual_align_bkl", "dual_align"), ("dual", "dual_kd"), ("dual_align", "kd"), ("ce_bkl", "ce"),
         ("dual_align", "ce"))


def best_tau(root: Path) -> tuple[list[str], dict]:
    """Tables 8-9: plain BinaryKL on g′ at the τ of best mean validation accuracy (over the seeds every τ has
    finished), against the recipe's BinaryKL-Norm at τ = 2 and plain BinaryKL at τ = 2, paired by seed."""
    text, summary = [], {}
    for k in (10, 100):
        runs = {tau: runs_of(root / f"k{k}", row) for tau, row in TAUS.items()}
        seeds = sorted(set.intersection(*(set(r) for r in runs.values())))
        if len(seeds) < 2:
            continue
        runs = {tau: {s: r[s] for s in seeds} for tau, r in runs.items()}
        val = {tau: sum(x["val"] for x in r.values()) / len(r) for tau, r in runs.items()}
        best = max(val, key=val.get)
        table = [[f"{tau}" + (" (chosen)" if tau == best else ""), mean_std([x["val"] for x in r.values()]),
                  mean_std([x["test"] for x in r.values()])] for tau, r in runs.items()]
        norm = runs_of(root / f"k{k}", "dual_align")
        diffs = [r for r in (paired_row(f"BinaryKL τ = {best} − BinaryKL-Norm τ = 2", runs[best], norm),
                             paired_row(f"BinaryKL τ = {best} − BinaryKL τ = 2", runs[best], runs[2])) if r]
        text.append(f"### Tables 8–9 at K = {k}: plain BinaryKL on g′ over τ, chosen on validation\n\n"
                    + markdown_table(["τ", "val acc (%)", "test acc (%)"], table) + "\n\n"
                    + markdown_table(["difference (test acc at best val epoch)", "seeds", "per seed (pp)",
                                      "mean (pp)", "paired t-test p"], diffs))
        summary[f"k{k}"] = {"chosen_tau": best, "mean_val": val}
    return text, summary


def main(root: Path, out: Path) -> None:
    text, summary = ablation_tables(root / "dhkd_ablation", ROWS, STEPS)
    tau_text, summary["best_tau"] = best_tau(root / "dhkd_ablation")
    write_tables(out, text + tau_text, summary)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
