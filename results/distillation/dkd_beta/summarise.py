"""Tables of the DKD beta study (``run.sh``): beta chosen on validation, its test accuracy, paired tests.

    PYTHONPATH=src python results/distillation/dkd_beta/summarise.py RUNS results/distillation/dkd_beta

Reads ``RUNS/dkd_beta/k<K>/{beta<B>,student}/seed<N>/metrics.jsonl`` (finished runs only); writes
``tables.md`` and ``summary.json``. Each run's "best" epoch is its highest validation accuracy; beta is chosen
by the mean over seeds of that validation accuracy; only then is the test accuracy of the choice read.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from kdcollapse.report import markdown_table, mean_std

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from study import paired_row, runs_of, write_tables  # noqa: E402  (results/distillation/study.py)

BETAS = (1, 2, 4, 8)


def main(root: Path, out: Path) -> None:
    text, summary = [], {}
    for k in (10, 100):
        base = root / f"dkd_beta/k{k}"
        runs = {b: runs_of(base, f"beta{b}") for b in BETAS}
        runs = {b: r for b, r in runs.items() if r}
        student = runs_of(base, "student")
        if not runs:
            continue
        shared = sorted(set.intersection(*(set(r) for r in runs.values())))  # seeds every beta finished
        chosen = max(runs, key=lambda b: statistics.mean(runs[b][s]["val"] for s in shared) if shared else -1)
        rows = [[f"β = {b}" + (" (chosen on val)" if b == chosen else ""), ",".join(map(str, r)),
                 mean_std([x["val"] for x in r.values()]), mean_std([x["test"] for x in r.values()]),
                 mean_std([x["last_test"] for x in r.values()])] for b, r in runs.items()]
        if student:
            rows.append(["student alone (CE)", ",".join(map(str, student)),
                         mean_std([x["val"] for x in student.values()]),
                         mean_std([x["test"] for x in student.values()]),
                         mean_std([x["last_test"] for x in student.values()])])
        text.append(f"### K = {k} (β chosen on the seeds {','.join(map(str, shared))}: β = {chosen})\n\n" + markdown_table(
            ["setting", "seeds", "val acc at best val epoch (%)", "test acc at best val epoch (%)",
             "last test acc (%)"], rows))
        tests = [row for row in (
            paired_row(f"β = {chosen} − β = 8", runs[chosen], runs.get(8, {})) if chosen != 8 else None,
            paired_row(f"β = {chosen} − student", runs[chosen], student),
            paired_row("β = 8 − student", runs.get(8, {}), student) if chosen != 8 else None) if row]
        if tests:
            text.append(markdown_table(["difference (test acc at best val epoch)", "seeds", "per seed (pp)",
                                        "mean (pp)", "paired t-test p"], tests))
        summary[f"k{k}"] = {"chosen_beta": chosen, "selection_seeds": shared,
                            "runs": {str(b): r for b, r in runs.items()}, "student": student}
    write_tables(out, text, summary)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
