"""Tables of the DKL Table 1 ablation (``run.sh``): each row's accuracy, and each step's paired difference.

    PYTHONPATH=src python results/distillation/dkl_ablation/summarise.py RUNS results/distillation/dkl_ablation

Reads ``RUNS/dkl_ablation/k<K>/<row>/seed<N>/`` (finished runs only); writes ``tables.md`` and
``summary.json``. Each run is read at its best-validation epoch (no setting is chosen: the rows are fixed by
the paper), and at its last epoch.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kdcollapse.report import markdown_table, mean_std

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from study import paired_row, runs_of, write_tables  # noqa: E402  (results/distillation/study.py)

ROWS = {"a_kd": "(a) KD", "b_dkl": "(b) DKL, α = β = 1", "c_dkl_ba": "(c) (b) + breaking asymmetry",
        "d_ikl": "(d) (c) + global information = IKL"}
STEPS = (("b_dkl", "a_kd"), ("c_dkl_ba", "b_dkl"), ("d_ikl", "c_dkl_ba"), ("d_ikl", "a_kd"))


def main(root: Path, out: Path) -> None:
    text, summary = [], {}
    for k in (10, 100):
        runs = {row: runs_of(root / f"dkl_ablation/k{k}", row) for row in ROWS}
        if not any(runs.values()):
            continue
        rows = [[ROWS[row], ",".join(map(str, r)), mean_std([x["val"] for x in r.values()]),
                 mean_std([x["test"] for x in r.values()]), mean_std([x["last_test"] for x in r.values()])]
                for row, r in runs.items() if r]
        text.append(f"### K = {k}\n\n" + markdown_table(
            ["row", "seeds", "val acc at best val epoch (%)", "test acc at best val epoch (%)", "last test acc (%)"],
            rows))
        steps = [r for a, b in STEPS if (r := paired_row(f"{a[0]} − {b[0]}", runs[a], runs[b]))]
        if steps:
            text.append(markdown_table(["difference (test acc at best val epoch)", "seeds", "per seed (pp)",
                                        "mean (pp)", "paired t-test p"], steps))
        summary[f"k{k}"] = runs
    write_tables(out, text, summary)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
