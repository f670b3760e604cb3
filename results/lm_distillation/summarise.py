"""The tables of results/lm_distillation/README.md from the run directories of the study, one directory per
arm, learning rate and seed, named ``<arm>_lr<lr>_s<seed>`` (the commands are in the README):

    python results/lm_distillation/summarise.py runs/lm2/grid

Arms: ``ce`` (cross-entropy only), ``fkl`` (forward KL), ``rkl`` (reverse KL), ``jsd`` (JSD(0.5)), ``skl``
(skew forward KL, α = 0.1), all on the same tokens; ``gkd`` (JSD(0.5) with half of each batch sampled by the
student, scored by the teacher online) is listed apart, one run. Each arm's learning rate is the one with the lowest
*validation* perplexity at seed 0 among those run; its seeds are then compared at that rate. Comparisons (each
distilled arm against cross-entropy only and against forward KL) are t-tests on test perplexity, paired by
seed; Holm's correction runs over every comparison printed.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

from kdcollapse.report import holm, mean_std, paired_t_test

ARMS = {"ce": "cross-entropy only", "fkl": "forward KL", "rkl": "reverse KL", "jsd": "JSD(0.5)",
        "skl": "skew forward KL (α = 0.1)"}
SINGLE = {"gkd": "GKD: JSD(0.5) with λ = 0.5 of each batch sampled by the student"}  # one seed, no test
METRICS = {"test_perplexity": ("test perplexity", 2), "test_forward_kl": ("forward KL to the teacher (test)", 3),
           "test_agreement": ("agreement with the teacher (test)", 3)}
TESTED = "test_perplexity"  # the page's outcome: the only metric tested (the others are described)
NAME = re.compile(r"(?P<arm>[a-z]+)_lr(?P<lr>[0-9.e-]+)_s(?P<seed>\d+)$")


def last_record(run_dir: Path) -> dict:
    return json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])


def finished_runs(study: Path) -> dict[str, dict[float, dict[int, dict]]]:
    """arm -> learning rate -> seed -> last metrics line, for every run whose student was saved."""
    runs: dict = defaultdict(lambda: defaultdict(dict))
    for path in sorted(study.iterdir()):
        match = NAME.match(path.name)
        if match and match["arm"] in {**ARMS, **SINGLE} and (path / "student").is_dir():
            runs[match["arm"]][float(match["lr"])][int(match["seed"])] = last_record(path)
    return runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("study", type=Path)
    args = parser.parse_args()
    runs = finished_runs(args.study)
    single = {arm: runs.pop(arm) for arm in SINGLE if arm in runs}
    print("Validation perplexity at seed 0 (the choice of learning rate):\n")
    rates = sorted({lr for arm in runs.values() for lr in arm})
    print("| arm | " + " | ".join(f"lr {lr:g}" for lr in rates) + " |\n" + "|---" * (len(rates) + 1) + "|")
    chosen = {}
    for arm in [a for a in ARMS if a in runs]:
        by_lr = runs[arm]
        seed0 = {lr: seeds[0]["validation_perplexity"] for lr, seeds in by_lr.items() if 0 in seeds}
        chosen[arm] = min(seed0, key=seed0.get)
        print(f"| {ARMS[arm]} | " + " | ".join(
            (f"**{seed0[lr]:.1f}**" if lr == chosen[arm] else f"{seed0[lr]:.1f}") if lr in seed0 else "not run"
            for lr in rates) + " |")
    arms = [arm for arm in ARMS if arm in chosen]
    seeds = sorted(set.intersection(*(set(runs[arm][chosen[arm]]) for arm in arms)))
    picked = {arm: [runs[arm][chosen[arm]][s] for s in seeds] for arm in arms}
    print(f"\nAt the chosen rates, seeds {seeds}:\n")
    print("| metric | " + " | ".join(f"{ARMS[a]} (lr {chosen[a]:g})" for a in arms) + " |")
    print("|---" * (len(arms) + 1) + "|")
    for key, (label, digits) in METRICS.items():
        print(f"| {label} | " + " | ".join(mean_std([r[key] for r in picked[a]], digits) for a in arms) + " |")
    pairs = [(a, "ce") for a in arms if a != "ce"] + [(a, "fkl") for a in arms if a not in ("ce", "fkl")]
    tests = [(a, b, *paired_t_test([r[TESTED] for r in picked[a]], [r[TESTED] for r in picked[b]]))
             for a, b in pairs]
    adjusted = holm([p for *_, p in tests])
    print(f"\nPaired by seed, on {METRICS[TESTED][0]} only (Holm over these {len(tests)} comparisons):\n")
    print("| comparison | paired difference | Holm p |\n|---|---|---|")
    for (a, b, diff, _), p in zip(tests, adjusted):
        shown = f"{diff:+.2f}" if p < 0.05 else f"not shown ({diff:+.2f})"
        print(f"| {ARMS[a]} − {ARMS[b]} | {shown} | {p:.3g} |")
    print("\nPer seed (validation / test perplexity):")
    for a in arms:
        print(f"- {ARMS[a]}: " + ", ".join(f"{r['validation_perplexity']:.1f} / {r['test_perplexity']:.1f}"
                                           for r in picked[a]))
    for arm, by_lr in single.items():
        for lr, seeds in sorted(by_lr.items()):
            for seed, r in sorted(seeds.items()):
                print(f"- {SINGLE[arm]} (lr {lr:g}, seed {seed}, one run): validation / test perplexity "
                      f"{r['validation_perplexity']:.1f} / {r['test_perplexity']:.1f}, forward KL "
                      f"{r['test_forward_kl']:.3f}, agreement {r['test_agreement']:.3f}")


if __name__ == "__main__":
    main()
