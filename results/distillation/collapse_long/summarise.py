"""Table of the long collapse runs (``run.sh``): per K and setting, outcome, accuracy and largest logit.

    PYTHONPATH=src python results/distillation/collapse_long/summarise.py RUNS results/distillation/collapse_long

Reads ``RUNS/collapse_long/k<K>/<setting>/seed<N>/`` with the reader of ``../collapse_k/summarise.py``; a
diverged run is "N.A.(e)", e the epoch it broke in. Writes ``tables.md`` and ``summary.json``.
"""

from __future__ import annotations

import sys
from pathlib import Path

from kdcollapse.report import markdown_table

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "collapse_k")]
from study import write_tables  # noqa: E402  (results/distillation/study.py)
from summarise import cell, load_run, paired_tests  # noqa: E402  (results/distillation/collapse_k/summarise.py)

SETTINGS = {"ce": "CE only", "bkl_only": "BinaryKL only (stable)", "ce_bkl_stable": "CE + BinaryKL one head, stable",
            "ce_bkl_official": "CE + BinaryKL one head, official clamp"}
PAIRS = [("ce_bkl_stable", "ce"), ("ce_bkl_stable", "bkl_only"), ("ce_bkl_official", "ce"),
         ("ce_bkl_official", "bkl_only"), ("ce_bkl_official", "ce_bkl_stable")]


def main(root: Path, out: Path) -> None:
    text, summary = [], {}
    for k in (10, 100):
        runs = {s: {int(p.name[4:]): r for p in sorted((root / f"collapse_long/k{k}/{s}").glob("seed*"))
                    if (r := load_run(p)) is not None} for s in SETTINGS}
        rows = [[SETTINGS[s], ",".join(map(str, r)), cell(r, "last_acc"), cell(r, "val_selected_acc"),
                 ", ".join(f"{x['max_logit']:.1f}" for x in r.values() if x.get("max_logit") is not None),
                 ", ".join(f"{max(x['train_acc']):.1f}" for x in r.values() if x["train_acc"])]
                for s, r in runs.items() if r]
        if rows:
            text.append(f"### K = {k}\n\n" + markdown_table(
                ["setting", "seeds", "last test acc (%)", "test acc at best val epoch (%)",
                 "largest logit (last saved)", "best train acc (%)"], rows))
        if tests := paired_tests(runs, PAIRS, SETTINGS):
            text.append(markdown_table(["difference (test acc)", "at", "seeds", "per seed (pp)", "mean (pp)",
                                        "paired t-test p"], tests))
        summary[f"k{k}"] = runs
    write_tables(out, text, summary)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
