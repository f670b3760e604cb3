"""The tables of results/lm_distillation/README.md from the run directories of the study:

    for seed in 0 1 2; do
        OMP_NUM_THREADS=1 kdcollapse distill-lm --config configs/lm/smollm2_tiny.yaml --baseline \\
            seed=$seed run_dir=runs/lm/study/fkl_s$seed
        OMP_NUM_THREADS=1 kdcollapse distill-lm --config configs/lm/smollm2_tiny.yaml \\
            loss.divergence=reverse_kl seed=$seed run_dir=runs/lm/study/rkl_s$seed
    done
    python results/lm_distillation/summarise.py runs/lm/study

Arms: ``fkl_s<seed>`` (forward KL), ``rkl_s<seed>`` (reverse KL), ``fkl_s<seed>-ce`` (cross-entropy only), all
on the same tokens. Comparisons are paired by seed; Holm's correction runs over every comparison printed.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kdcollapse.report import mean_std, paired_t_test

ARMS = {"forward KL": "fkl_s{}", "reverse KL": "rkl_s{}", "cross-entropy only": "fkl_s{}-ce"}
METRICS = {"test_perplexity": ("test perplexity", 2), "test_forward_kl": ("forward KL to the teacher (test)", 3),
           "test_agreement": ("agreement with the teacher (test)", 3)}
PAIRS = [("forward KL", "cross-entropy only"), ("reverse KL", "cross-entropy only"), ("forward KL", "reverse KL")]


def last_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def holm(pvalues: list[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the input order."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * len(pvalues), 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


def complete_seeds(study: Path) -> list[int]:
    """Seeds whose every arm finished (its student saved)."""
    seeds = {int(p.name.removeprefix("fkl_s")) for p in study.glob("fkl_s*") if not p.name.endswith("-ce")}
    return sorted(s for s in seeds if all((study / arm.format(s) / "student").is_dir() for arm in ARMS.values()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study", type=Path)
    args = parser.parse_args()
    seeds = complete_seeds(args.study)
    runs = {arm: [last_record(args.study / pattern.format(s)) for s in seeds] for arm, pattern in ARMS.items()}
    print(f"seeds: {seeds}\n")
    print("| metric | " + " | ".join(ARMS) + " |")
    print("|---" * (len(ARMS) + 1) + "|")
    for key, (label, digits) in METRICS.items():
        print(f"| {label} | " + " | ".join(mean_std([r[key] for r in runs[arm]], digits) for arm in ARMS) + " |")
    tests = [(a, b, key, *paired_t_test([r[key] for r in runs[a]], [r[key] for r in runs[b]]))
             for a, b in PAIRS for key in METRICS]
    adjusted = holm([p for *_, p in tests])
    print("\n| comparison | metric | paired difference | Holm p |\n|---|---|---|---|")
    for (a, b, key, diff, _), p in zip(tests, adjusted):
        label, digits = METRICS[key]
        print(f"| {a} − {b} | {label} | {diff:+.{digits}f} | {p:.3g} |")


if __name__ == "__main__":
    main()
