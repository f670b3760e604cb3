"""Tables of the follow-up to the alpha x lr grid (``run.sh``): BinaryKL alone at large alpha and gradient clipping, each beside its reference without the change from ``../collapse_grid`` (same RUNS).

    PYTHONPATH=src python results/distillation/collapse_clip/summarise.py RUNS results/distillation/collapse_clip
"""

from __future__ import annotations

import sys
from pathlib import Path

from kdcollapse.report import markdown_table

sys.path[:0] = [
    str(Path(__file__).resolve().parents[1]),
    str(Path(__file__).resolve().parents[1] / "collapse_k"),
]
from study import paired_row, write_tables
from summarise import cell, load_run

ALPHAS = ("1", "10", "30")
CLIPS = ("0.1", "1.0")
DIFF_HEADER = [
    "difference (test acc at best val epoch)",
    "seeds",
    "per seed (pp)",
    "mean (pp)",
    "paired t-test p",
]


def seeds(path: Path) -> dict[int, dict]:
    """Seed -> ``load_run`` of every ``path/seed<N>`` that has an outcome."""
    return {
        int(p.name[4:]): r
        for p in sorted(path.glob("seed*"))
        if (r := load_run(p)) is not None
    }


def tested(runs: dict[int, dict]) -> dict[int, dict]:
    """The finished runs as ``paired_row`` reads them (their test accuracy at the best validation epoch)."""
    return {
        s: {"test": r["val_selected_acc"]}
        for s, r in runs.items()
        if r.get("val_selected_acc") is not None
    }


def section(k: int, root: Path) -> tuple[list[str], dict]:
    here, grid = root / f"collapse_clip/k{k}", root / f"collapse_grid/k{k}"
    run = (
        {name: seeds(here / name) for name in sorted(p.name for p in here.iterdir())}
        if here.is_dir()
        else {}
    )
    ref = (
        {name: seeds(grid / name) for name in sorted(p.name for p in grid.iterdir())}
        if grid.is_dir()
        else {}
    )
    get = lambda table, name: table.get(name, {})
    text = []
    lrs = ("0.1", "0.05")
    rows = [
        [
            f"BinaryKL alone, α = {a}",
            *(
                cell(
                    get(ref, f"bkl_only_lr{lr}")
                    if a == "1"
                    else get(run, f"bkl_only_a{a}_lr{lr}"),
                    "val_selected_acc",
                )
                or "–"
                for lr in lrs
            ),
        ]
        for a in ALPHAS
    ]
    rows += [
        [
            f"CE + BinaryKL, α = {a}",
            *(
                cell(get(ref, f"ce_bkl_a{a}_lr{lr}"), "val_selected_acc") or "–"
                for lr in lrs
            ),
        ]
        for a in ALPHAS
    ]
    text.append(
        f"### K = {k}: BinaryKL alone against CE + BinaryKL (stable form), test acc (%) at the best "
        "validation epoch\n\n"
        + markdown_table(["setting", *(f"lr {lr}" for lr in lrs)], rows)
    )
    columns = (
        ("ce", "CE alone"),
        ("ce_bkl_a1", "CE + BinaryKL, α = 1"),
        ("ce_bkl_a10", "CE + BinaryKL, α = 10"),
    )
    rows = [
        [
            "none",
            *(
                cell(get(ref, f"{name}_lr0.1"), "val_selected_acc") or "–"
                for name, _ in columns
            ),
        ]
    ]
    rows += [
        [
            c,
            *(
                cell(get(run, f"{name}_lr0.1_clip{c}"), "val_selected_acc") or "–"
                for name, _ in columns
            ),
        ]
        for c in CLIPS
    ]
    diffs = [
        r
        for c in CLIPS
        for name, label in columns[1:]
        if (
            r := paired_row(
                f"{label}, clip {c} − CE alone, no clip",
                tested(get(run, f"{name}_lr0.1_clip{c}")),
                tested(get(ref, "ce_lr0.1")),
            )
        )
    ]
    text.append(
        f"### K = {k}: gradient clipping at lr 0.1 (max global gradient norm, the paper's Table 7 "
        "values), test acc (%)\n\n"
        + markdown_table(["max norm", *(label for _, label in columns)], rows)
        + ("\n\n" + markdown_table(DIFF_HEADER, diffs) if diffs else "")
    )
    return text, run


def main(root: Path, out: Path) -> None:
    text, summary = [], {}
    for k in (10, 100):
        part, runs = section(k, root)
        text += part
        summary[f"k{k}"] = runs
    write_tables(out, text, summary)


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
