"""Peak memory and time of the LM distillation loss fused with the output heads against the unfused loss.

Both start from hidden states: the student's (N, H) requiring grad with its head W (V, H), the teacher's
(N, H) with its own head (no grad). Unfused: logits = h Wᵀ for both models, then
``forward_kl_loss`` + 0.5·cross-entropy on (N, V) tensors, backward. Fused: ``fused_head_loss`` with a
``TeacherHead`` (the same loss, chunk_size 256 tokens), backward. Peak = the largest running total of
PyTorch's CPU allocator during one forward + backward (profiler memory events, as in
``bench_loss_memory.py``): the inputs are not counted, the gradients of h and W are. Time = the wall time
of that same call, every cell in this one process. Before the first cell, both losses run once, profiled, on
a small cell of each dtype (unless --no-warm-up): the first profiled call of a process pays one-time costs
(profiler and kernel start-up) that made the first fused call about 5 s slower than the later ones.

    OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/bench_fused_lm_losses.py \\
        --markdown results/benchmarks/fused_lm_losses.md

The unfused loss runs only where eight float32 (N, V) tensors take less than --memory-share of the free
memory (a shared 24 GiB machine); the others are listed as not run. --max-hidden skips H above it at
and --max-cost skips cells with N·V·H above it (each such call takes minutes on one core).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from _timing import shared_machine  # benchmarks/_timing.py
from bench_loss_memory import peak_mib  # benchmarks/bench_loss_memory.py
from kdcollapse.losses import TeacherHead, forward_kl_loss, fused_head_loss

CHUNK = 256  # tokens per chunk of the fused loss
GRID = [(1024, 49152, 576), (1024, 128256, 576), (2048, 49152, 576), (4096, 49152, 576), (8192, 49152, 576),
        (1024, 49152, 2048), (1024, 128256, 2048), (8192, 128256, 576), (8192, 49152, 2048), (8192, 128256, 2048)]


def inputs(n: int, v: int, h: int, dtype: torch.dtype):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(n, h, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(v, h, generator=g) / h**0.5).to(dtype).requires_grad_()
    t_hidden = torch.randn(n, h, generator=g).to(dtype)
    t_weight = (torch.randn(v, h, generator=g) / h**0.5).to(dtype)
    labels = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, t_hidden, t_weight, labels


def unfused(hidden, weight, t_hidden, t_weight, labels):
    with torch.no_grad():
        teacher = t_hidden @ t_weight.T
    logits = hidden @ weight.T
    return forward_kl_loss(logits, teacher) + 0.5 * F.cross_entropy(logits.float(), labels)


def fused(hidden, weight, t_hidden, t_weight, labels):
    return fused_head_loss(hidden, weight, TeacherHead(t_hidden, t_weight), labels=labels, ce_weight=0.5,
                           chunk_size=CHUNK)


def measure(loss_fn, tensors) -> tuple[float, float]:
    """(peak MiB, seconds) of one forward + backward, timed around the profiled call itself (the profiler
    records a few dozen large operations per call: its overhead is small and the same for both losses)."""
    hidden, weight = tensors[:2]
    weight.grad = None
    start = time.perf_counter()
    peak = peak_mib(lambda *_: loss_fn(*tensors), hidden, None, None)
    return peak, time.perf_counter() - start


def warm_up(dtypes: list[torch.dtype]) -> None:
    """One profiled forward + backward of each loss on a small cell per dtype, so no measured call is the first."""
    for dtype in dtypes:
        tensors = inputs(2 * CHUNK, 4096, 64, dtype)
        measure(fused, tensors)
        measure(unfused, tensors)


def fits(n: int, v: int, share: float) -> bool:
    """Whether eight float32 (N, V) tensors (about the unfused peak) take under ``share`` of the free memory."""
    free = int(next(line.split()[1] for line in open("/proc/meminfo") if line.startswith("MemAvailable"))) * 1024
    return 8 * n * v * 4 < share * free


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--max-tokens", type=int, default=8192)
    parser.add_argument("--cells", nargs="*", metavar="N,V,H", help="only these cells of the grid")
    parser.add_argument("--dtypes", nargs="*", default=["float32", "bfloat16"])
    parser.add_argument("--max-hidden", type=int, default=2048, help="skip larger H (time)")
    parser.add_argument("--max-cost", type=float, default=float("inf"),
                        help="skip cells with N·V·H above this (each fused call costs about 8·N·V·H flops)")
    parser.add_argument("--memory-share", type=float, default=0.35,
                        help="run the unfused loss only where it needs less than this share of the free memory")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="measure without the small warm-up calls (the first measured call pays start-up costs)")
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    rows = []
    if not args.no_warm_up:
        warm_up([getattr(torch, name) for name in args.dtypes])
    for n, v, h in GRID:
        if n > args.max_tokens or h > args.max_hidden or n * v * h > args.max_cost:
            continue
        if args.cells and f"{n},{v},{h}" not in args.cells:
            continue
        for dtype in (getattr(torch, name) for name in args.dtypes):
            tensors = inputs(n, v, h, dtype)
            row = {"n": n, "v": v, "h": h, "dtype": str(dtype).removeprefix("torch.")}
            row["fused"] = measure(fused, tensors)
            row["unfused"] = measure(unfused, tensors) if fits(n, v, args.memory_share) else None
            rows.append(row)
            print(line(row), flush=True)
            del tensors
    if args.markdown:
        args.markdown.write_text(render(rows, (load_before, os.getloadavg()[0])))


def line(r: dict) -> str:
    fused_peak, fused_s = r["fused"]
    text = f"N={r['n']} V={r['v']} H={r['h']} {r['dtype']}: fused {fused_peak:.0f} MiB {fused_s:.2f} s"
    if r["unfused"] is None:
        return text + "; unfused not run (would not fit the free memory)"
    peak, seconds = r["unfused"]
    return text + f"; unfused {peak:.0f} MiB {seconds:.2f} s; peak {fused_peak / peak:.3f}x, time {fused_s / seconds:.2f}x"


def render(rows: list[dict], load: tuple[float, float]) -> str:
    table = ["| N | V | H | dtype | fused peak | unfused peak | **peak ratio** | fused time | unfused time | time ratio |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fp, fs = r["fused"]
        if r["unfused"] is None:
            table.append(f"| {r['n']} | {r['v']:,} | {r['h']} | {r['dtype']} | {fp:.0f} MiB | not run | — | "
                         f"{fs:.1f} s | — | — |")
            continue
        up, us = r["unfused"]
        table.append(f"| {r['n']} | {r['v']:,} | {r['h']} | {r['dtype']} | {fp:.0f} MiB | {up:.0f} MiB | "
                     f"**{fp / up:.3f}×** | {fs:.1f} s | {us:.1f} s | {fs / us:.2f}× |")
    return "\n".join(["# Fused head losses: peak memory and time against the unfused loss", "",
                      shared_machine(load) + f", CPU capability {torch.backends.cpu.get_cpu_capability()}.",
                      "Command: `OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/bench_fused_lm_losses.py "
                      "--max-hidden 576 --markdown results/benchmarks/fused_lm_losses.md`; one profiled and timed "
                      "forward + backward per cell, all in one process (see the script's docstring).", "", *table, ""])


if __name__ == "__main__":
    main()
