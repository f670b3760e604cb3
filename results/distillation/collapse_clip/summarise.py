"""Tables of the follow-up to the alpha x lr grid (``run.sh``): BinaryKL alone at large alpha, gradient clipping and
the official clamp, each beside its reference without the change from ``../collapse_grid`` (the same RUNS).

    PYTHONPATH=src python results/distillation/collapse_clip/summarise.py RUNS results/distillation/collapse_clip
"""

from __future__ import annotations

import sys
from pathlib import Path

from kdcollapse.report import markdown_table

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parents[1] / "collapse_k")]
from study import paired_row, write_tables  # noqa: E402  (results/distillation/study.py)
from summarise import cell, load_run  # noqa: E402  (results/distillation/collapse_k/summarise.py)

ALPHAS = ("1", "10", "30")
CLIPS = ("0.1", "1.0")
DIFF_HEADER = ["difference (test acc at best val epoch)", "seeds", "per seed (pp)", "mean (pp)", "paired t-test p"]


def settings(path: Path) -> dict[str, dict[int, dict]]:
    """Setting -> seed -> ``load_run`` of every ``path/<setting>/seed<N>`` that has an outcome."""
    if not path.is_dir():
        return {}
    return {d.name: {int(p.name[4:]): r for p in sorted(d.glob("seed*")) if (r := load_run(p)) is not None}
            for d in sorted(path.iterdir()) if d.is_dir()}


def tested(runs: dict[int, dict]) -> dict[int, dict]:
    """The finished runs as ``paired_row`` reads them (their test accuracy at the best validation epoch)."""
    return {s: {"test": r["val_selected_acc"]} for s, r in runs.items() if r.get("val_selected_acc") is not None}


def acc(runs: dict[int, dict]) -> str:
    return cell(runs, "val_selected_acc") or "–"


def max_logits(runs: dict[int, dict]) -> str:
    """Each run's largest student logit on its validation split (at its last good epoch), by seed."""
    return ", ".join(f"{r['max_logit']:.1f}" for r in runs.values() if r.get("max_logit") is not None) or "–"


def diff_table(pairs: list[tuple[str, dict, dict]]) -> str:
    rows = [row for label, a, b in pairs if (row := paired_row(label, tested(a), tested(b)))]
    return "\n\n" + markdown_table(DIFF_HEADER, rows) if rows else ""


def section(k: int, root: Path) -> tuple[list[str], dict]:
    run, ref = settings(root / f"collapse_clip/k{k}"), settings(root / f"collapse_grid/k{k}")
    new, old = (lambda name: run.get(name, {})), (lambda name: ref.get(name, {}))
    lrs = ("0.1", "0.05")
    alone = {a: {lr: old(f"bkl_only_lr{lr}") if a == "1" else new(f"bkl_only_a{a}_lr{lr}") for lr in lrs}
             for a in ALPHAS}
    rows = [[f"BinaryKL alone, α = {a}", *(acc(alone[a][lr]) for lr in lrs)] for a in ALPHAS]
    rows += [[f"CE + BinaryKL, α = {a}", *(acc(old(f"ce_bkl_a{a}_lr{lr}")) for lr in lrs)] for a in ALPHAS]
    text = [f"### K = {k}: BinaryKL alone against CE + BinaryKL (stable form), test acc (%) at the best validation "
            "epoch\n\n" + markdown_table(["setting", *(f"lr {lr}" for lr in lrs)], rows)
            + diff_table([(f"CE + BinaryKL − BinaryKL alone, α = {a}, lr {lr}", old(f"ce_bkl_a{a}_lr{lr}"),
                           alone[a][lr]) for a in ALPHAS[1:] for lr in lrs])]

    columns = (("ce", "CE alone"), ("ce_bkl_a1", "CE + BinaryKL, α = 1"), ("ce_bkl_a10", "CE + BinaryKL, α = 10"))
    rows = [["none", *(acc(old(f"{name}_lr0.1")) for name, _ in columns)]]
    rows += [[c, *(acc(new(f"{name}_lr0.1_clip{c}")) for name, _ in columns)] for c in CLIPS]
    pairs = [(f"{label}: clip {c} − no clip", new(f"{name}_lr0.1_clip{c}"), old(f"{name}_lr0.1"))
             for name, label in columns for c in CLIPS]
    pairs += [(f"{label}, clip {c} − CE alone, no clip (Table 7's comparison)", new(f"{name}_lr0.1_clip{c}"),
               old("ce_lr0.1")) for name, label in columns[1:] for c in CLIPS]
    text.append(f"### K = {k}: gradient clipping at lr 0.1 (max global gradient norm; values from the paper's Table "
                "7), test acc (%)\n\n" + markdown_table(["max norm", *(label for _, label in columns)], rows)
                + diff_table(pairs))

    rows = [[f"α = {a}", acc(old(f"ce_bkl_a{a}_lr0.1")), acc(new(f"ce_bkl_official_a{a}_lr0.1")),
             max_logits(new(f"ce_bkl_official_a{a}_lr0.1"))] for a in ALPHAS]
    text.append(f"### K = {k}: CE + BinaryKL at lr 0.1, stable against official (float32 clamp) form, test acc (%)"
                "\n\n" + markdown_table(["α", "stable", "official", "official: largest validation logit, by seed"],
                                        rows)
                + diff_table([(f"official − stable, α = {a}", new(f"ce_bkl_official_a{a}_lr0.1"),
                               old(f"ce_bkl_a{a}_lr0.1")) for a in ALPHAS]))
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
