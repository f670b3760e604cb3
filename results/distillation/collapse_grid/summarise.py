"""Grid tables of the alpha x lr study (``run.sh``): test accuracy at the best validation epoch of CE + BinaryKL
on one head, of CE alone and of BinaryKL alone, per K; a diverged run is "N.A.(e)", e the epoch it broke in.

    PYTHONPATH=src python results/distillation/collapse_grid/summarise.py RUNS results/distillation/collapse_grid
"""

from __future__ import annotations

import sys
from pathlib import Path

from kdcollapse.report import markdown_table

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "collapse_k")]
from study import paired_row, write_tables  # noqa: E402  (results/distillation/study.py)
from summarise import cell, load_run  # noqa: E402  (results/distillation/collapse_k/summarise.py)

LRS = ("0.1", "0.05", "0.01")
ROWS = {"ce": "CE alone", "bkl_only": "BinaryKL alone", **{f"ce_bkl_a{a}": f"CE + BinaryKL, α = {a}"
                                                            for a in ("0.1", "0.3", "1", "3", "10", "30")}}


def tested(runs: dict[int, dict]) -> dict[int, dict]:
    """The finished runs as ``paired_row`` reads them (their test accuracy at the best validation epoch)."""
    return {seed: {"test": r["val_selected_acc"]} for seed, r in runs.items() if r.get("val_selected_acc") is not None}


def main(root: Path, out: Path) -> None:
    text, summary = [], {}
    for k in (10, 100):
        runs = {(row, lr): {int(p.name[4:]): r for p in sorted((root / f"collapse_grid/k{k}/{row}_lr{lr}").glob("seed*"))
                            if (r := load_run(p)) is not None} for row in ROWS for lr in LRS}
        if not any(runs.values()):
            continue
        rows = [[label, *(cell(runs[row, lr], "val_selected_acc") or "–" for lr in LRS)] for row, label in ROWS.items()]
        text.append(f"### K = {k}: test acc (%) at the best validation epoch\n\n" +
                    markdown_table(["setting", *(f"lr {lr}" for lr in LRS)], rows))
        tests = [row for lr in LRS for alone in ("ce", "bkl_only")
                 if (row := paired_row(f"α = 1 − {ROWS[alone]}, lr {lr}", tested(runs["ce_bkl_a1", lr]),
                                       tested(runs[alone, lr])))]
        if tests:
            text.append(markdown_table(["difference (test acc at best val epoch)", "seeds", "per seed (pp)",
                                        "mean (pp)", "paired t-test p"], tests))
        summary[f"k{k}"] = {f"{row}_lr{lr}": r for (row, lr), r in runs.items()}
    write_tables(out, text, summary)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
