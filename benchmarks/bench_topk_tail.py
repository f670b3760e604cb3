"""CPU time of a divergence on the teacher's stored top-k tokens by the two rules for the rest of its mass
(``losses.TopKTeacher``'s ``tail``): ``rest`` (the rest as one outcome; ``distill-lm teacher_tail=rest``, the rule
of studies/lm_distillation_pruned) against ``uniform`` (the rest spread evenly), as a ratio per divergence.

Each call is the fused head loss (``losses.fused_head_loss``: hidden states and the student's head, one forward
and backward, the study's arms at their settings) on the same stored top-k; the rules and divergences are timed
in rounds, each round in a shuffled order, medians of this process's CPU time.

    OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/bench_topk_tail.py \\
        --markdown results/benchmarks/topk_tail.md
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from _timing import emit, interleave, shared_machine, timer  # benchmarks/_timing.py
from bench_fused_lm_losses import inputs  # benchmarks/bench_fused_lm_losses.py
from kdcollapse.losses import TopKTeacher, fused_head_loss

# the arms of studies/lm_distillation_pruned/study.yaml: divergence and its parameters
ARMS = {"forward_kl": {}, "reverse_kl": {}, "jsd": {"beta": 0.5}, "skew_forward_kl": {"alpha": 0.1},
        "skew_reverse_kl": {"alpha": 0.1}, "tvd": {}, "abkd": {"alpha": 0.2, "beta": 0.7}, "akl": {"mu": 0.5},
        "dkd": {"beta": 8.0}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cell", metavar="N,V,H", default="1024,49152,576")
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    n, v, h = map(int, args.cell.split(","))
    hidden, weight, t_hidden, t_weight, labels = inputs(n, v, h, torch.float32)
    with torch.no_grad():
        t_logits = t_hidden @ t_weight.T
    stored = {tail: TopKTeacher.from_logits(t_logits, args.k, tail=tail) for tail in ("uniform", "rest")}
    del t_logits

    def call(arm: str, tail: str):
        def step():
            hidden.grad = weight.grad = None
            fused_head_loss(hidden, weight, stored[tail], arm, labels=labels, **ARMS[arm]).backward()
        return step

    timers = {(arm, tail): timer(call(arm, tail), cpu=True) for arm in args.arms for tail in stored}
    for fn in timers.values():  # warm-up: no timed call is the first of its kind
        fn()
    seconds = interleave(timers, args.rounds)
    rows = ["| divergence | uniform tail | rest as one outcome | **rest / uniform** |", "|---|---|---|---|"]
    for arm in args.arms:
        uniform, rest = seconds[(arm, "uniform")], seconds[(arm, "rest")]
        rows.append(f"| {arm} | {uniform:.2f} s | {rest:.2f} s | **{rest / uniform:.3f}×** |")
        print(f"{arm}: uniform {uniform:.2f} s, rest {rest:.2f} s, {rest / uniform:.3f}x", flush=True)
    arms = "" if args.arms == list(ARMS) else " --arms " + " ".join(args.arms)
    command = (f"OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/bench_topk_tail.py --cell {args.cell} "
               f"--k {args.k} --rounds {args.rounds}{arms} --markdown results/benchmarks/topk_tail.md")
    emit("\n".join([
        "# The stored teacher's tail: the rest as one outcome against the rest spread evenly", "",
        f"{shared_machine((load_before, os.getloadavg()[0]))}. N = {n} tokens, V = {v:,}, H = {h}, top {args.k}, "
        f"float32; the fused head loss forward and backward (the student's logits from hidden states), CPU time of "
        f"this process, median of {args.rounds} rounds, each round in a shuffled order.",
        f"Command: `{command}`.", "", *rows, ""]), args.markdown)


if __name__ == "__main__":
    main()
