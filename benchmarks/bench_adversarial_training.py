"""Cost of IKL-AT relative to TRADES, and throughput of the robustness evaluation.

1. Training step: one step of the ``ikl_at`` method and of the ``trades`` method (same model, same
   batch, same inner attack: ``trades_attack``, 10 steps) = attack + forward of the natural and
   adversarial batch + loss + backward + SGD step. Steps of the two methods alternate, so a change of
   the machine's load hits both alike; the ratio of the medians is printed (target ≤ 1.05), and that
   of the minima. The loss part (network forwards + loss + backward on a fixed adversarial batch) and
   the loss function alone (on fixed logits) are timed the same way, to show what the IKL term costs.
2. Evaluation (with ``--run-dir``): images/s of every attack of AutoAttack standard and of PGD-20 on
   the run's model and the first ``--n-examples`` test images, as ``kdcollapse robust-eval`` runs them.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_adversarial_training.py --steps 15
    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_adversarial_training.py --steps 0 \\
        --run-dir /work/runs/adversarial/fmnist_trades/seed0 --eps 0.1 --n-examples 100
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import time

import torch

from _timing import machine  # benchmarks/_timing.py
from kdcollapse.adversarial import parse_eps
from kdcollapse.config import method_config
from kdcollapse.methods import build_method
from kdcollapse.models import create_model


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def bench_steps(args) -> None:
    channels, size = (1, 28) if args.model in ("convnet_small", "convnet", "mlp") else (3, 32)
    torch.manual_seed(0)
    student = create_model(args.model, args.num_classes, in_channels=channels)
    x = torch.randn(args.batch_size, channels, size, size).clamp(-1.5, 1.5)
    y = torch.randint(0, args.num_classes, (args.batch_size,))
    methods, optimizers = {}, {}
    for name in ("trades", "ikl_at"):
        options = {"name": name, "eps": args.eps, "step_size": args.eps / 4, "steps": args.attack_steps}
        methods[name] = build_method(method_config(options), copy.deepcopy(student),
                                     num_classes=args.num_classes)
        methods[name].set_input_normalization((0.5,), (0.5,))  # x in [-1.5, 1.5] <-> images in [0, 1]
        optimizers[name] = torch.optim.SGD(methods[name].parameters(), lr=1e-3, momentum=0.9)

    def step(name):
        out = methods[name](x, y)
        optimizers[name].zero_grad()
        methods[name].backward(out, lambda loss: loss)
        optimizers[name].step()
        methods[name].after_step()

    x_adv = x + 0.05 * torch.randn_like(x)

    def loss_only(name):
        m = methods[name]
        m.zero_grad()
        m.training_loss(m.student(x), m.student(x_adv), y).backward()

    logits = torch.randn(args.batch_size, args.num_classes, requires_grad=True)
    logits_adv = (logits + 0.5 * torch.randn_like(logits)).detach().requires_grad_(True)

    def loss_function(name):
        for _ in range(10):
            methods[name].training_loss(logits, logits_adv, y).backward()

    cases = ((step, "training step (attack + loss + backward + SGD)", args.steps),
             (loss_only, "network forwards + loss + backward", args.steps),
             (loss_function, "loss function alone, ×10 (logits → loss → backward)", 10 * args.steps))
    for fn, label, repeats in cases:
        times = {"trades": [], "ikl_at": []}
        for name in times:  # warm-up
            fn(name)
        for i in range(repeats):
            for name in (("trades", "ikl_at") if i % 2 == 0 else ("ikl_at", "trades")):
                times[name].append(timed(lambda: fn(name)))
        med = {k: statistics.median(v) for k, v in times.items()}
        low = {k: min(v) for k, v in times.items()}
        print(f"| {label} | {args.model}, K = {args.num_classes} | {args.batch_size} | {repeats} | "
              f"{med['trades'] * 1e3:.1f} | {med['ikl_at'] * 1e3:.1f} | **{med['ikl_at'] / med['trades']:.3f}** | "
              f"{low['ikl_at'] / low['trades']:.3f} |")


def bench_evaluation(args) -> None:
    from kdcollapse.adversarial import Normalized, autoattack_standard, pgd_evaluate
    from kdcollapse.experiments.robust_eval import load_test_images
    from kdcollapse.runs import load_model

    net, meta = load_model(args.run_dir)
    model = Normalized(net, meta["mean"], meta["std"]).eval()
    x, y = load_test_images(meta["dataset"], n_examples=args.n_examples)
    for result in (autoattack_standard(model, x, y, eps=args.eps, progress=False),
                   pgd_evaluate(model, x, y, eps=args.eps, steps=20, progress=False)):
        print(f"\nclean {result.clean_accuracy:.2%}, robust {result.robust_accuracy:.2%}\n")
        print(result.table())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="convnet_small")
    parser.add_argument("--num-classes", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=128)
    parser.add_argument("--steps", type=int, default=15, help="timed steps per method (0: skip)")
    parser.add_argument("--attack-steps", type=int, default=10)
    parser.add_argument("--eps", default="0.1")
    parser.add_argument("--run-dir", help="a trained run: also time its evaluation")
    parser.add_argument("--n-examples", type=int, default=100)
    args = parser.parse_args()
    args.eps = parse_eps(args.eps)
    load = os.getloadavg()
    print(f"{machine(torch.device('cpu'))}, load average {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}\n")
    if args.steps:
        print("| timed | model | batch | repeats per method | TRADES median (ms) | IKL-AT median (ms) | "
              "IKL-AT / TRADES (medians) | (minima) |")
        print("|---|---|---:|---:|---:|---:|---:|---:|")
        bench_steps(args)
    if args.run_dir:
        bench_evaluation(args)
    load = os.getloadavg()
    print(f"\nload average at the end {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}")


if __name__ == "__main__":
    main()
