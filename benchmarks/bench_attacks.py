"""Throughput of each attack of the AutoAttack-standard chain (and PGD/TRADES) on a CIFAR-shaped model.

Every point keeps its label (the model's own prediction) and ε is tiny, so no point is broken and
every attack spends its whole budget: the worst case, i.e. the cost per robust point. Besides
images/s, each attack's time is compared with the time its model calls alone take, measured in the
same process right after it (forward + input gradient, and plain forward, of the same batch, times the
number of each the attack made): `overhead` = measured / that baseline; 1.0 means the attack adds
nothing around the model.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_attacks.py --batch-size 32 --runs 1
"""

from __future__ import annotations

import argparse
import os

import torch
from torch import nn

from _timing import machine, median_seconds  # benchmarks/_timing.py
from kdcollapse.adversarial import (
    apgd_attack,
    apgd_targeted_attack,
    fab_attack,
    pgd_attack,
    square_attack,
    trades_attack,
)
from kdcollapse.errors import KdcollapseError


class SmallConvNet(nn.Module):
    """A ~0.03M-parameter CIFAR-shaped conv net, used when the model zoo has no resnet8."""

    def __init__(self, num_classes: int = 10):
        super().__init__()

        def block(cin, cout, stride):
            return [nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

        self.net = nn.Sequential(*block(3, 16, 1), *block(16, 32, 2), *block(32, 64, 2),
                                 nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, num_classes))

    def forward(self, x):
        return self.net(x)


def make_model() -> tuple[nn.Module, str]:
    try:
        from kdcollapse.models import count_parameters, create_model

        model = create_model("resnet8", num_classes=10)
        name = "resnet8"
    except (ImportError, KdcollapseError):
        model, name = SmallConvNet(), "SmallConvNet (local; resnet8 not in the model zoo yet)"
        count_parameters = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    return model.eval(), f"{name}, {count_parameters(model) / 1e6:.3f}M parameters"


class Counted(nn.Module):
    """Counts the images the wrapped model sees with and without an input gradient."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model
        self.with_grad = self.without_grad = 0

    def forward(self, x):
        if torch.is_grad_enabled() and x.requires_grad:
            self.with_grad += x.shape[0]
        else:
            self.without_grad += x.shape[0]
        return self.model(x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--runs", type=int, default=3, help="timed repetitions per attack (median reported)")
    parser.add_argument("--n-iter", type=int, default=100, help="APGD/FAB iterations (standard: 100)")
    parser.add_argument("--n-targets", type=int, default=9, help="APGD-T/FAB-T targets (standard: 9)")
    parser.add_argument("--n-queries", type=int, default=5000, help="Square queries (standard: 5000)")
    parser.add_argument("--norm", default="Linf", choices=["Linf", "L2"])
    args = parser.parse_args()

    torch.manual_seed(0)
    model, description = make_model()
    counted = Counted(model)
    x = torch.rand(args.batch_size, 3, 32, 32)
    with torch.no_grad():
        y = model(x).argmax(1)
    eps = 1e-6  # nothing is broken: every attack runs its full budget
    n, g = args.n_iter, torch.Generator().manual_seed(0)
    attacks = {
        "pgd-10": lambda: pgd_attack(counted, x, y, norm=args.norm, eps=eps, step_size=eps / 4, steps=10, generator=g),
        "trades-10": lambda: trades_attack(counted, x, norm=args.norm, eps=eps, step_size=eps / 4, generator=g),
        "apgd-ce": lambda: apgd_attack(counted, x, y, norm=args.norm, eps=eps, n_iter=n, generator=g),
        "apgd-t": lambda: apgd_targeted_attack(counted, x, y, norm=args.norm, eps=eps, n_iter=n,
                                               n_targets=args.n_targets, generator=g),
        "fab-t": lambda: fab_attack(counted, x, y, norm=args.norm, eps=eps, n_iter=n, n_targets=args.n_targets),
        "square": lambda: square_attack(counted, x, y, norm=args.norm, eps=eps, n_queries=args.n_queries, generator=g),
    }

    def grad_step():
        xg = x.clone().requires_grad_(True)
        torch.autograd.grad(model(xg).sum(), xg)

    def forward():
        with torch.no_grad():
            model(x)

    grad_step(), forward()  # warm-up
    print(f"machine: {machine(torch.device('cpu'))}; load {os.getloadavg()[0]:.2f} (1-min) at start")
    print(f"model: {description}; batch {args.batch_size}, norm {args.norm}, runs {args.runs}\n")
    print("| attack | images/s | s per batch | grad evals / image | forwards / image | model-call baseline (s) "
          "| overhead |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, attack in attacks.items():
        counted.with_grad = counted.without_grad = 0
        t = median_seconds(attack, args.runs, warm_up=False)
        per_image_grad = counted.with_grad / args.batch_size / args.runs
        per_image_fwd = counted.without_grad / args.batch_size / args.runs
        # the baseline is measured next to each attack: the machine's load drifts
        ideal = (per_image_grad * median_seconds(grad_step, 5, warm_up=False)
                 + per_image_fwd * median_seconds(forward, 5, warm_up=False))
        print(f"| {name} | {args.batch_size / t:.2f} | {t:.2f} | {per_image_grad:.0f} | {per_image_fwd:.0f} | "
              f"{ideal:.2f} | {t / ideal:.2f} |", flush=True)
    print(f"\nload {os.getloadavg()[0]:.2f} (1-min) at the end")


if __name__ == "__main__":
    main()
