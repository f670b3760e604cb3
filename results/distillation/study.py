"""What the distillation studies' summaries share: a finished run's validation-selected accuracies, the runs of
one setting over seeds, and a paired comparison row (used by ``dkd_beta/`` and ``dkl_ablation/``)."""

from __future__ import annotations

import json
from pathlib import Path

from kdcollapse.report import markdown_table, mean_std, paired_t_test
from kdcollapse.runs import read_metrics


def load(run: Path) -> dict | None:
    """``{"val", "test", "last_test"}`` of a finished run (``outcome.json`` of ``run_queue.py``): validation
    and test accuracy at its best-validation epoch, and the last epoch's test accuracy; None otherwise."""
    outcome = run / "outcome.json"
    if not outcome.is_file() or json.loads(outcome.read_text())["status"] != "finished":
        return None
    records = read_metrics(run)
    best = max(records, key=lambda r: r["val_acc"])
    return {"val": best["val_acc"], "test": best["test_acc"], "last_test": records[-1]["test_acc"]}


def runs_of(root: Path, name: str) -> dict[int, dict]:
    """Seed -> :func:`load` of every finished ``root/name/seed<N>``."""
    return {int(p.name[4:]): r for p in sorted(root.glob(f"{name}/seed*")) if (r := load(p)) is not None}


def paired_row(label: str, a: dict[int, dict], b: dict[int, dict]) -> list[str] | None:
    """A table row of the test-accuracy difference a − b over the seeds both have, with a paired t-test."""
    seeds = sorted(set(a) & set(b))
    if len(seeds) < 2:
        return None
    d, p = paired_t_test([a[s]["test"] for s in seeds], [b[s]["test"] for s in seeds])
    per = ", ".join(f"{a[s]['test'] - b[s]['test']:+.2f}" for s in seeds)
    return [label, ",".join(map(str, seeds)), per, f"{d:+.2f}", f"{p:.3f}"]


def write_tables(out: Path, text: list[str], summary: dict) -> None:
    """Write a study's ``tables.md`` (the markdown sections in ``text``) and ``summary.json``, and print them."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "tables.md").write_text("\n\n".join(text) + "\n")
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print("\n\n".join(text))


def ablation_tables(root: Path, rows: dict[str, str], steps: tuple[tuple[str, str], ...]) -> tuple[list[str], dict]:
    """Markdown sections and a summary of an ablation: for K = 10 and 100, each row's accuracies over its
    finished seeds (``root/k<K>/<row>/seed<N>``, read at the best-validation epoch; nothing is chosen, the
    rows are fixed), and the paired test-accuracy difference of each step ``(a, b)``."""
    text, summary = [], {}
    for k in (10, 100):
        runs = {row: runs_of(root / f"k{k}", row) for row in rows}
        if not any(runs.values()):
            continue
        table = [[rows[row], ",".join(map(str, r)), mean_std([x["val"] for x in r.values()]),
                  mean_std([x["test"] for x in r.values()]), mean_std([x["last_test"] for x in r.values()])]
                 for row, r in runs.items() if r]
        text.append(f"### K = {k}\n\n" + markdown_table(
            ["row", "seeds", "val acc at best val epoch (%)", "test acc at best val epoch (%)", "last test acc (%)"],
            table))
        diffs = [r for a, b in steps if (r := paired_row(f"{rows[a].split(' ')[0]} − {rows[b].split(' ')[0]}",
                                                          runs[a], runs[b]))]
        if diffs:
            text.append(markdown_table(["difference (test acc at best val epoch)", "seeds", "per seed (pp)",
                                        "mean (pp)", "paired t-test p"], diffs))
        summary[f"k{k}"] = runs
    return text, summary
