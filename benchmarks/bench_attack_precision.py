"""The attacks' search in bf16 and channels-last (``robust-eval --precision bf16 --channels-last``) against the
float32 search: seconds per batch and the robust accuracy each finds (verdicts are float32 in every case).

A convnet_small trained here for two epochs on 6,000 Fashion-MNIST images (so that the attacks break some
points and the robust accuracies can be compared), attacked on the first test images at ε = 0.1; every
evaluation is ``evaluate_attacks`` with APGD-CE and PGD, interleaved rounds in one process, median seconds.

    PYTHONPATH=src python benchmarks/bench_attack_precision.py --threads 1
    PYTHONPATH=src python benchmarks/bench_attack_precision.py --device cuda
"""

from __future__ import annotations

import argparse
import time

import torch

import torch.nn.functional as F

from _timing import interleave, machine
from kdcollapse.adversarial import Normalized, apgd_attack, pgd_attack
from kdcollapse.adversarial._evaluate import evaluate_attacks
from kdcollapse.data import load_dataset
from kdcollapse.models import create_model

SEARCHES = {"float32": ("off", False), "bf16": ("bf16", False), "channels_last": ("off", True),
            "bf16 + channels_last": ("bf16", True)}


def trained_model() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    """convnet_small after two epochs on 6,000 training images (inside it: the dataset's normalisation),
    and the test images in [0, 1] with their labels."""
    train, test = load_dataset("fashion_mnist", "train"), load_dataset("fashion_mnist", "test")
    net = Normalized(create_model("convnet_small", 10, in_channels=1), train.mean, train.std)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    x, y = train.inputs[:6000].float() / 255, train.labels[:6000]
    for _ in range(2):
        for i in torch.randperm(6000).split(64):
            loss = F.cross_entropy(net(x[i]), y[i])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    return net.eval(), test.inputs.float() / 255, test.labels


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu or cuda (then fp16 is a further search option)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--eps", type=float, default=0.1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = torch.device(args.device)
    model, images, labels = trained_model()
    model, x, y = model.to(device), images[:args.batch].to(device), labels[:args.batch].to(device)
    if device.type == "cuda":
        SEARCHES["fp16 + channels_last"] = ("fp16", True)
    attacks = [("apgd-ce", lambda m, xb, yb: apgd_attack(m, xb, yb, eps=args.eps, n_iter=args.iterations,
                                                         generator=torch.Generator().manual_seed(0))),
               ("pgd", lambda m, xb, yb: pgd_attack(m, xb, yb, eps=args.eps, step_size=args.eps / 4,
                                                    steps=args.iterations, generator=torch.Generator().manual_seed(0)))]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    robust: dict[str, float] = {}

    def timer(name: str):
        def run() -> float:
            precision, channels_last = SEARCHES[name]
            model.to(memory_format=torch.contiguous_format)
            start = time.perf_counter()
            result = evaluate_attacks(model, x, y, attacks, norm="Linf", eps=args.eps, batch_size=args.batch,
                                      progress=False, precision=precision, channels_last=channels_last)
            sync()
            robust[name] = result.robust_accuracy
            return time.perf_counter() - start
        return run

    times = interleave({name: timer(name) for name in SEARCHES}, args.rounds)
    base = times["float32"]
    print(f"# attack search precision — {machine(device)}\n")
    print(f"convnet_small (Fashion-MNIST, 2 epochs), first {args.batch} test images, APGD-CE + PGD, {args.iterations} iterations each, "
          f"ε = {args.eps:.4f}, {args.rounds} interleaved rounds\n")
    print("| search | s | ratio to float32 | robust accuracy (float32 verdicts) |\n|---|---|---|---|")
    for name, seconds in times.items():
        print(f"| {name} | {seconds:.2f} | {seconds / base:.2f} | {robust[name]:.2%} |")


if __name__ == "__main__":
    main()
