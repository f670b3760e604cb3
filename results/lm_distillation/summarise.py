"""The table of results/lm_distillation/README.md from the run directories of the study:

    for seed in 0 1 2; do
        OMP_NUM_THREADS=1 kdcollapse distill-lm --config configs/lm/smollm2_tiny.yaml --baseline \\
            seed=$seed run_dir=runs/lm/study/fkl_s$seed
    done
    python results/lm_distillation/summarise.py runs/lm/study

Each seed has a forward-KL student (``fkl_s<seed>``) and a cross-entropy-only student (``fkl_s<seed>-ce``)
trained on the same tokens; the comparison is paired by seed, Holm-corrected over the three metrics.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from kdcollapse.report import mean_std, paired_t_test

METRICS = {"test_perplexity": "test perplexity", "test_agreement": "agreement with the teacher (test)",
           "test_forward_kl": "forward KL per token to the teacher (test)"}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study", type=Path)
    args = parser.parse_args()
    seeds = sorted(int(p.parent.name.removeprefix("fkl_s")) for p in args.study.glob("fkl_s*/metrics.jsonl")
                   if (args.study / f"{p.parent.name}-ce" / "student").is_dir() and (p.parent / "student").is_dir())
    kd = [last_record(args.study / f"fkl_s{s}") for s in seeds]
    ce = [last_record(args.study / f"fkl_s{s}-ce") for s in seeds]
    tests = {key: paired_t_test([r[key] for r in kd], [r[key] for r in ce]) for key in METRICS}
    adjusted = dict(zip(tests, holm([p for _, p in tests.values()])))
    print(f"seeds: {seeds}")
    print("| metric | forward KL (top-64 teacher tokens) | cross-entropy only | paired difference | Holm p |")
    print("|---|---|---|---|---|")
    for key, label in METRICS.items():
        digits = 2 if key == "test_perplexity" else 3
        diff, _ = tests[key]
        print(f"| {label} | {mean_std([r[key] for r in kd], digits)} | {mean_std([r[key] for r in ce], digits)} | "
              f"{diff:+.{digits}f} | {adjusted[key]:.3g} |")


if __name__ == "__main__":
    main()
