"""The trainer's DKD step against a bare PyTorch loop doing the same work (issue 28: target <= 1.02x).

"trainer": the real ``Trainer.step`` of ``method.name=dkd`` (student and teacher forward, CE + DKD through the
method, backward, the optimizer step). "bare loop": the same student and teacher (copies, same weights), the
same batches and an optimizer of the same type and settings, in eight lines of plain PyTorch::

    with autocast:  # the run's precision (train.amp); x in the run's memory layout
        with torch.no_grad(): t = teacher(x).float()
        s = student(x)
        loss = F.cross_entropy(s, y) + ramp * dkd_loss(s, t, y, alpha, beta, temperature)
    optimizer.zero_grad(set_to_none=True); loss.backward(); optimizer.step()

"bare loop, official DKD formula": the same loop with the DKD loss written as the official code computes it
(masks, ``softmax(z/τ − 1000·gt)`` for the non-target part; megvii-research/mdistiller at a08d46f,
mdistiller/distillers/DKD.py), so the last column also compares kdcollapse's loss with the official
computation. Every round times ``--steps`` steps of each case in a shuffled order; each case's step time is
its median over the rounds, and the ratio is that of the medians.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_dkd_step.py --rounds 7
    PYTHONPATH=src python benchmarks/bench_dkd_step.py --pair resnet32x4-\\>resnet8x4 --rounds 5

``--amp auto`` times the run in bf16 autocast where the CPU computes it natively; ``--clock cpu`` times by the
process's CPU time instead of wall time (with one thread, what the step itself costs on a shared machine).
"""

from __future__ import annotations

import argparse
import copy
import itertools
import os
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from _timing import interleave, machine  # benchmarks/_timing.py
from bench_speed import PAIRS, build, teacher_file  # benchmarks/bench_speed.py (its CIFAR-shaped dataset too)
from kdcollapse.losses import dkd_loss


CLOCK = [time.perf_counter]  # --clock cpu: time.process_time, this process's CPU time (one thread: less
# sensitive than wall time to other jobs on a shared machine)


def official_dkd(logits_student, logits_teacher, target, alpha, beta, temperature):
    """The DKD loss as the official code computes it (a transcription of the formula, for timing only)."""
    gt = torch.zeros_like(logits_student).scatter_(1, target.unsqueeze(1), 1).bool()
    other = torch.ones_like(logits_student).scatter_(1, target.unsqueeze(1), 0).bool()
    p_s = F.softmax(logits_student / temperature, dim=1)
    p_t = F.softmax(logits_teacher / temperature, dim=1)
    b_s = torch.cat([(p_s * gt).sum(1, keepdims=True), (p_s * other).sum(1, keepdims=True)], dim=1)
    b_t = torch.cat([(p_t * gt).sum(1, keepdims=True), (p_t * other).sum(1, keepdims=True)], dim=1)
    tckd = F.kl_div(torch.log(b_s), b_t, reduction="sum") * temperature**2 / target.shape[0]
    log_nt_s = F.log_softmax(logits_student / temperature - 1000.0 * gt, dim=1)
    nt_t = F.softmax(logits_teacher / temperature - 1000.0 * gt, dim=1)
    nckd = F.kl_div(log_nt_s, nt_t, reduction="sum") * temperature**2 / target.shape[0]
    return alpha * tckd + beta * nckd


def bare_loop(trainer, loss_fn):
    """A timer: seconds per step of the plain loop on copies of the trainer's student, teacher and optimizer."""
    student = copy.deepcopy(trainer.method.student).train()
    teacher = copy.deepcopy(trainer.method.teacher.model).eval()
    optimizer = type(trainer.optimizer)(student.parameters(), **trainer.optimizer.defaults)
    cfg = trainer.method.config
    ramp = min(1.0, 1 / cfg.warmup_epochs) if cfg.warmup_epochs else 1.0  # epoch 1, as the trainer's method

    def steps(batches):
        start = CLOCK[0]()
        for x, y in batches:
            x = trainer.to_layout(x)  # the run's memory layout and precision, as the trainer's step
            with trainer.precision():  # the method's whole forward runs in it, losses included
                with torch.no_grad():
                    t = teacher(x).float()  # the trainer's teacher hands float32 logits to the method
                s = student(x)
                loss = F.cross_entropy(s, y) + ramp * loss_fn(s, t, y, cfg.alpha, cfg.beta, cfg.temperature)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
        return (CLOCK[0]() - start) / len(batches)

    return steps


def trainer_steps(trainer):
    def steps(batches):
        start = CLOCK[0]()
        for x, y in batches:
            trainer.step(trainer.to_layout(x), y)
        return (CLOCK[0]() - start) / len(batches)

    return steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", default="digits:convnet_small->convnet_small", choices=list(PAIRS))
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--amp", default="off", choices=["off", "auto", "bf16"],
                        help="train.amp of the run (auto: bf16 where the CPU computes it natively)")
    parser.add_argument("--clock", default="wall", choices=["wall", "cpu"],
                        help="wall: time.perf_counter; cpu: this process's CPU time (time.process_time)")
    args = parser.parse_args()
    CLOCK[0] = time.process_time if args.clock == "cpu" else time.perf_counter
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        teacher_file(Path(tmp), args.pair, PAIRS[args.pair][1])
        trainer = build(Path(tmp), args.pair, ["train.device=cpu", f"train.amp={args.amp}"], "cpu", method="dkd")
        trainer.train_loader.set_epoch(0)
        trainer.method.train()
        batches = list(itertools.islice(iter(trainer.train_loader), args.steps))
        cases = {"trainer (method.name=dkd)": trainer_steps(trainer), "bare loop": bare_loop(trainer, dkd_loss),
                 "bare loop, official DKD formula": bare_loop(trainer, official_dkd)}
        for run in cases.values():
            run(batches[:2])  # warm-up
        medians = interleave({name: (lambda r=run: r(batches)) for name, r in cases.items()}, args.rounds)
    base = medians["bare loop"]
    print(f"Machine: {machine(torch.device('cpu'))}; 1-minute load average {load_before:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end.")
    precision = {None: "float32", torch.bfloat16: "bf16 autocast"}.get(trainer.amp_dtype, str(trainer.amp_dtype))
    layout = "channels-last" if trainer.channels_last() else "contiguous"
    print(f"Pair {args.pair}, batch 64, {args.steps} steps per case per round, {args.rounds} interleaved rounds; "
          f"every case in the run's precision ({precision}, train.amp={args.amp}) and layout ({layout}); "
          f"{'CPU' if args.clock == 'cpu' else 'wall'} time.\n")
    print("| case | step ms (median of rounds) | ratio to the bare loop |\n|---|---|---|")
    for name, seconds in medians.items():
        print(f"| {name} | {1e3 * seconds:.1f} | {seconds / base:.3f} |")


if __name__ == "__main__":
    main()
