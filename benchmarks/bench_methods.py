"""Time per training step of each distillation method relative to KD, measured in one process.

    PYTHONPATH=src python benchmarks/bench_methods.py            # resnet32x4 -> resnet8x4, batch 64, CIFAR shapes
    PYTHONPATH=src python benchmarks/bench_methods.py --steps 3 --out results/benchmarks/bench_methods.md

A step is what the trainer does: forward (teacher pass included), the method's ``backward`` (two
gradient computations for DHKD's alignment), one SGD step. Methods are timed round-robin, one step each
per round, so a change of machine load hits every method alike; the ratio to KD is taken within each
round and its median reported. Target (issue "Logit distillation"): DHKD with alignment <= 1.5x KD;
the DHKD paper (Table 10, RTX 3090) reports KD 11 ms, DKD 11 ms, DHKD 14 ms, DHKD + alignment 21 ms.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from _timing import cpu_model  # benchmarks/_timing.py
from kdcollapse.config import method_config
from kdcollapse.methods import FrozenTeacher, build_method
from kdcollapse.models import create_model

METHODS = {  # label -> method section
    "KD": {"name": "kd"},
    "DKD": {"name": "dkd"},
    "IKL-KD": {"name": "ikl_kd"},
    "DHKD (no alignment)": {"name": "dhkd", "alignment": "off"},
    "DHKD + alignment (global, official)": {"name": "dhkd", "alignment": "global"},
    "DHKD + alignment (shared)": {"name": "dhkd", "alignment": "shared"},
    "dual head + KD": {"name": "dual_head_kd"},
}
PAPER_MS = {"KD": 11, "DKD": 11, "DHKD (no alignment)": 14, "DHKD + alignment (global, official)": 21}


def build(section: dict, teacher: FrozenTeacher, num_classes: int, device: torch.device):
    torch.manual_seed(0)
    student = create_model("resnet8x4", num_classes)
    method = build_method(method_config(section), student, num_classes=num_classes, teacher=teacher).to(device)
    optimizer = torch.optim.SGD(method.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4)
    return method.train(), optimizer


def step(method, optimizer, x, y) -> None:
    optimizer.zero_grad(set_to_none=True)
    out = method(x, y)
    method.backward(out, lambda loss: loss)
    optimizer.step()


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def load() -> str:
    return " ".join(f"{v:.2f}" for v in os.getloadavg())


def machine() -> str:
    return f"{cpu_model()}, {os.cpu_count()} logical CPUs, torch {torch.__version__}, {torch.get_num_threads()} threads"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=5, help="timed rounds (median over them)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--out", default=None, help="also write the markdown report here")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device, k = torch.device(args.device), 100
    torch.manual_seed(0)
    teacher = FrozenTeacher(create_model("resnet32x4", k)).to(device)
    x = torch.randn(args.batch_size, 3, 32, 32, device=device)
    y = torch.randint(0, k, (args.batch_size,), device=device)
    runs = {label: build(section, teacher, k, device) for label, section in METHODS.items()}
    load_before = load()
    wall: dict[str, list[float]] = {label: [] for label in runs}
    cpu: dict[str, list[float]] = {label: [] for label in runs}
    for round_ in range(args.warmup + args.steps):
        for label, (method, optimizer) in runs.items():
            sync(device)
            start, start_cpu = time.perf_counter(), time.process_time()
            step(method, optimizer, x, y)
            sync(device)
            if round_ >= args.warmup:
                wall[label].append(time.perf_counter() - start)
                cpu[label].append(time.process_time() - start_cpu)
        print(f"round {round_ + 1}/{args.warmup + args.steps} done", file=sys.stderr)
    report = render(wall, cpu, args, load_before, load())
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0


def ratio_to_kd(times: dict[str, list[float]], label: str) -> float:
    """Median over rounds of (this method's step) / (KD's step in the same round)."""
    return statistics.median(t / r for t, r in zip(times[label], times["KD"]))


def render(wall: dict[str, list[float]], cpu: dict[str, list[float]], args, load_before: str,
           load_after: str) -> str:
    lines = [
        "| method | wall: median step (ms) | wall: ratio to KD | CPU time: median step (ms) | CPU time: ratio to KD "
        "| paper (ms, RTX 3090) | paper ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for label in wall:
        paper = PAPER_MS.get(label)
        paper_cells = f"{paper} | {paper / PAPER_MS['KD']:.2f}" if paper else " | "
        lines.append(f"| {label} | {1000 * statistics.median(wall[label]):.0f} | {ratio_to_kd(wall, label):.2f} | "
                     f"{1000 * statistics.median(cpu[label]):.0f} | {ratio_to_kd(cpu, label):.2f} | {paper_cells} |")
    command = "PYTHONPATH=src python benchmarks/bench_methods.py " + " ".join(sys.argv[1:])
    return "\n".join([
        "# Distillation methods: time per training step relative to KD",
        "",
        f"resnet32x4 (teacher, frozen) -> resnet8x4, batch {args.batch_size}, 3x32x32 inputs, 100 classes, "
        f"{args.device}; forward with the teacher pass + method backward + SGD step; median of {args.steps} "
        f"rounds after {args.warmup} warm-up rounds, methods interleaved round-robin. Ratios: median over rounds "
        "of (method step / KD step in the same round). CPU time (`time.process_time`, all threads of this "
        "process) is less sensitive than wall time to other processes on a shared machine.",
        "",
        *lines,
        "",
        f"- machine: {machine()}",
        f"- load average (1, 5, 15 min) before: {load_before}; after: {load_after}",
        f"- command: `{command.strip()}`",
        "",
    ])


if __name__ == "__main__":
    sys.exit(main())
