"""What the not yet ported distillation summaries share (collapse_k, collapse_grid, collapse_clip, collapse_long):
a paired comparison row and the writing of ``tables.md`` / ``summary.json``. The ported pages (dkd_beta,
dkl_ablation, dhkd_ablation) are study files: ``kdcollapse study report`` (docs/studies.md)."""

from __future__ import annotations

import json
from pathlib import Path

from kdcollapse.report import paired_t_test


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
