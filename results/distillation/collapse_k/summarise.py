"""Tables of the collapse study (``run.sh``): per K and setting, outcome, accuracy, largest logit, paired tests.

    PYTHONPATH=src python results/distillation/collapse_k/summarise.py RUNS results/distillation/collapse_k

Reads ``RUNS/collapse/k<K>/<setting>/seed<N>/{metrics.jsonl,outcome.json}``; writes ``tables.md`` and
``summary.json``. A diverged run counts as "N.A.(e)" (the paper's notation: e = the epoch it broke in).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from kdcollapse.report import markdown_table, mean_std, paired_t_test
from kdcollapse.runs import read_metrics

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from study import write_tables  # noqa: E402  (results/distillation/study.py)

# setting -> what it is (rows in this order)
SETTINGS = {
    "ce_lr0.1": "CE only, lr 0.1",
    "bkl_only_lr0.1": "BinaryKL only (stable), lr 0.1",
    "ce_bkl_stable_a1_lr0.1": "CE + BinaryKL one head, stable, α 1, lr 0.1",
    "ce_bkl_official_a1_lr0.1": "CE + BinaryKL one head, official, α 1, lr 0.1",
    "ce_bkl_official_a1_lr0.01": "CE + BinaryKL one head, official, α 1, lr 0.01",
    "ce_bkl_stable_a10_lr0.1": "CE + BinaryKL one head, stable, α 10, lr 0.1",
    "bkl_only_a10_lr0.1": "BinaryKL only (stable), α 10, lr 0.1",
    "ce_bkl_official_a10_lr0.1": "CE + BinaryKL one head, official, α 10, lr 0.1",
    "ce_bkl_official_a0.1_lr0.1": "CE + BinaryKL one head, official, α 0.1, lr 0.1",
    "ce_bkl_official_a1_lr0.1_clip0.5": "CE + BinaryKL one head, official, α 1, lr 0.1, grad clip 0.5",
    "dhkd_lr0.1": "DHKD (stable), lr 0.1",
}
# (a, b): paired test of a − b over the seeds both finished
PAIRS = [("ce_bkl_stable_a1_lr0.1", "ce_lr0.1"), ("ce_bkl_stable_a1_lr0.1", "bkl_only_lr0.1"),
         ("ce_bkl_official_a1_lr0.1", "ce_bkl_stable_a1_lr0.1"), ("dhkd_lr0.1", "ce_bkl_stable_a1_lr0.1")]


def load_run(run: Path) -> dict | None:
    if not (run / "outcome.json").is_file():
        return None
    out = json.loads((run / "outcome.json").read_text())
    records = read_metrics(run)
    out["last_acc"] = records[-1]["test_acc"] if records and out["status"] == "finished" else None
    evaluated = [r for r in records if "val_acc" in r]  # every epoch, or every train.eval_every-th and the last
    if evaluated and out["status"] == "finished":
        best = max(evaluated, key=lambda r: r["val_acc"])
        out["val_selected_acc"] = best["test_acc"]
    out["train_acc"] = [r["train_acc"] for r in records]
    out["test_acc"] = [r["test_acc"] for r in evaluated]
    return out


def cell(runs: dict[int, dict], key: str) -> str:
    done = [r[key] for r in runs.values() if r.get(key) is not None]
    diverged = [f"N.A.({r['epochs_done'] + 1})" for r in runs.values() if r["status"] == "diverged"]
    return ", ".join(([mean_std(done)] if done else []) + diverged)


def paired_tests(runs: dict[str, dict[int, dict]], pairs: list[tuple[str, str]], labels: dict[str, str]) -> list:
    """Table rows of the paired test-accuracy differences a − b (at the last epoch and at the best validation
    epoch) over the seeds where both finished, with a paired t-test."""
    tests = []
    for a, b in pairs:
        if a not in runs or b not in runs:
            continue
        for key, what in (("last_acc", "last epoch"), ("val_selected_acc", "best val epoch")):
            seeds = [s for s in runs[a] if s in runs[b] and runs[a][s].get(key) is not None
                     and runs[b][s].get(key) is not None]
            if len(seeds) < 2:
                continue
            x, y = [runs[a][s][key] for s in seeds], [runs[b][s][key] for s in seeds]
            d, p = paired_t_test(x, y)
            per = ", ".join(f"{u - v:+.2f}" for u, v in zip(x, y))
            tests.append([f"{labels[a]} − {labels[b]}", what, ",".join(map(str, seeds)), per, f"{d:+.2f}", f"{p:.3f}"])
    return tests


def main(root: Path, out: Path) -> None:
    summary, text = {}, []
    for k in (10, 100):
        rows, runs_k = [], {}
        for name, label in SETTINGS.items():
            runs = {int(p.name[4:]): r for p in sorted((root / f"collapse/k{k}/{name}").glob("seed*"))
                    if (r := load_run(p)) is not None}
            if not runs:
                continue
            runs_k[name] = runs
            logits = [r["max_logit"] for r in runs.values() if r["max_logit"] is not None]
            rows.append([label, ",".join(map(str, runs)), cell(runs, "last_acc"), cell(runs, "val_selected_acc"),
                         ", ".join(f"{x:.1f}" for x in logits),
                         "; ".join(f"s{s}: " + " ".join(f"{a:.0f}" for a in r["test_acc"]) for s, r in runs.items())])
        text.append(f"### K = {k}\n\n" + markdown_table(
            ["setting", "seeds", "last test acc (%)", "test acc at best val epoch (%)", "largest logit (last saved)",
             "test acc per epoch, per seed"], rows))
        tests = paired_tests(runs_k, PAIRS, SETTINGS)
        if tests:
            text.append(markdown_table(["difference (test acc)", "at", "seeds", "per seed (pp)", "mean (pp)",
                                        "paired t-test p"], tests))
        summary[f"k{k}"] = runs_k
    write_tables(out, text, summary)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
