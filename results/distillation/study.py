"""What the distillation studies' summaries share: a finished run's validation-selected accuracies, the runs of
one setting over seeds, and a paired comparison row (used by ``dkd_beta/`` and ``dkl_ablation/``)."""

from __future__ import annotations

import json
from pathlib import Path

from kdcollapse.report import paired_t_test
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
