"""Peak memory and time of the logit losses, forward + backward, at N = 1024 rows and V = 32,000.

Peak memory is read from PyTorch's own CPU allocator through the profiler
(``torch.profiler.profile(profile_memory=True)``): every tensor allocation and free inside the
profiled block is an instant event with its size in bytes (negative for a free), so the largest
running sum of those sizes, in order, is the peak extra memory of the block. (The events' own
"Total Allocated" field is not used: it carries over between profiling sessions in one process.)
Unlike the resident set (VmHWM), it counts tensors only — no allocator caching, page-fault
granularity or other threads' memory — and unlike ``tracemalloc`` it sees the C++ allocations
torch makes. The
inputs are allocated before the block, so they are not counted; the student's gradient
(N × V in the input dtype, kept after backward) is. Every case runs in this one process, the
teacher has no gradient, and ratios are against ``F.kl_div`` on ``log_softmax`` / ``softmax`` of the same
inputs (torch's plain KL, computed in the inputs' dtype), the baseline of issue 28. ``--cases`` picks cases
by label (the baseline always runs).

Times are medians over --runs calls after one warm-up, in the same process.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_loss_memory.py --runs 3 \\
        --markdown results/benchmarks/bench_loss_memory.md
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

from _timing import shared_machine  # benchmarks/_timing.py
from kdcollapse.losses import dkd_loss, ikl_loss, kd_loss

ROWS, VOCAB, CHUNK = 1024, 32000, 128  # N positions (e.g. 8 sequences × 128 tokens), V, chunk rows
BASELINE = "F.kl_div(log_softmax, softmax)"  # the plain KL of torch, which every ratio divides by
CASES = {  # label -> loss(student, teacher, target)
    BASELINE: lambda s, t, y: 4.0 * F.kl_div(F.log_softmax(s / 2.0, dim=-1), F.softmax(t / 2.0, dim=-1),
                                             reduction="batchmean"),
    "kd_loss": lambda s, t, y: kd_loss(s, t, 2.0),
    "dkd_loss": lambda s, t, y: dkd_loss(s, t, y, 1.0, 8.0, 2.0),
    f"dkd_loss, chunk_size={CHUNK}": lambda s, t, y: dkd_loss(s, t, y, 1.0, 8.0, 2.0,
                                                             chunk_size=CHUNK),
    "ikl_loss": lambda s, t, y: ikl_loss(s, t, mse_weight=8.0, temperature=2.0),
    f"ikl_loss, chunk_size={CHUNK}": lambda s, t, y: ikl_loss(s, t, mse_weight=8.0, temperature=2.0,
                                                             chunk_size=CHUNK),
    f"kd_loss, chunk_size={CHUNK}": lambda s, t, y: kd_loss(s, t, 2.0, chunk_size=CHUNK),
}


def inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    student = (3 * torch.randn(ROWS, VOCAB, generator=g)).to(dtype).requires_grad_()
    teacher = (3 * torch.randn(ROWS, VOCAB, generator=g)).to(dtype)
    return student, teacher, torch.randint(0, VOCAB, (ROWS,), generator=g)


def step(loss_fn, student, teacher, target) -> None:
    student.grad = None
    loss_fn(student, teacher, target).backward()


def peak_mib(loss_fn, student, teacher, target) -> float:
    """Largest running total of the CPU allocator's allocations minus frees during one call."""
    student.grad = None
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        loss_fn(student, teacher, target).backward()
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory = sorted((e["ts"], e["args"]["Ev Idx"], e["args"]["Bytes"]) for e in events
                    if e.get("name") == "[memory]")
    total = peak = 0
    for _, _, size in memory:  # + allocations, − frees, in order
        total += size
        peak = max(peak, total)
    return peak / 2**20


def median_seconds(loss_fn, student, teacher, target, runs: int) -> float:
    step(loss_fn, student, teacher, target)  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        step(loss_fn, student, teacher, target)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--cases", help=f"comma-separated labels (default: all): {', '.join(CASES)}")
    args = parser.parse_args()
    chosen = [BASELINE, *(c for c in args.cases.split(",") if c != BASELINE)] if args.cases else list(CASES)
    unknown = [c for c in chosen if c not in CASES]
    if unknown:
        parser.error(f"unknown case(s) {unknown}; choose from {list(CASES)}")
    load_before = os.getloadavg()[0]
    rows = []
    for dtype in (torch.float32, torch.bfloat16):
        tensors = inputs(dtype)
        for label in chosen:
            loss_fn = CASES[label]
            row = {"case": label, "dtype": str(dtype).removeprefix("torch."),
                   "peak": peak_mib(loss_fn, *tensors),
                   "seconds": median_seconds(loss_fn, *tensors, args.runs)}
            rows.append(row)
            base = next(r for r in rows if r["dtype"] == row["dtype"] and r["case"] == BASELINE)
            print(f"{row['dtype']:>8} {label:<32} peak {row['peak']:7.1f} MiB "
                  f"({row['peak'] / base['peak']:.2f}x F.kl_div), {1e3 * row['seconds']:7.1f} ms "
                  f"({row['seconds'] / base['seconds']:.2f}x)", flush=True)
        del tensors
    if args.markdown:
        args.markdown.write_text(render(rows, args.runs, (load_before, os.getloadavg()[0]), args.cases))


def render(rows: list[dict], runs: int, load: tuple[float, float], cases: str | None) -> str:
    lines = ["| inputs | loss | peak beyond the inputs | vs F.kl_div | time | vs F.kl_div |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        base = next(b for b in rows if b["dtype"] == r["dtype"] and b["case"] == BASELINE)
        lines.append(f"| {r['dtype']} | `{r['case']}` | {r['peak']:.0f} MiB | "
                     f"**{r['peak'] / base['peak']:.2f}×** | {1e3 * r['seconds']:.0f} ms | "
                     f"{r['seconds'] / base['seconds']:.2f}× |")
    return "\n".join([
        "# Loss memory: KD, DKD and IKL against torch's plain KL, `F.kl_div` (N = 1024, V = 32,000)",
        "",
        shared_machine(load) + ".",
        f"Command: `OMP_NUM_THREADS={torch.get_num_threads()} PYTHONPATH=src python "
        f"benchmarks/bench_loss_memory.py --runs {runs}" + (f" --cases '{cases}'" if cases else "") +
        " --markdown results/benchmarks/bench_loss_memory.md`",
        f"One forward + backward per cell, student logits requiring grad, teacher without; "
        f"N = {ROWS} rows, V = {VOCAB}, τ = 2, DKD α = 1, β = 8, IKL mse_weight 8 with sample-wise "
        f"weights. Peak = the largest running total of PyTorch CPU-allocator bytes during the call "
        f"(profiler memory events, `profile_memory=True`), one measured call per cell: the inputs "
        f"(N × V each) are not counted, the student's gradient is. Time = median of {runs} calls "
        "after one warm-up, all cells in one process.",
        "",
        *lines,
        "",
        "`F.kl_div` is computed in the inputs' dtype (bfloat16 for bfloat16 inputs); kdcollapse's losses "
        "accumulate bfloat16 in float32. With a teacher without gradient, unchunked `kd_loss` keeps one "
        "float32 (N, V) tensor, p_s − p_t, filled block by block of rows, and writes the gradient in the "
        "student's dtype; unchunked `dkd_loss` keeps only its inputs and recomputes both non-target "
        "softmaxes in place in the backward pass (custom autograd functions with the exact gradient). "
        "The chunked forms compute the per-row values chunk by chunk without keeping intermediates "
        "and recompute each chunk in the backward pass, writing its gradient into one preallocated "
        "tensor; what is left at the peak is the gradient and one chunk's temporaries. The other jobs "
        "on the shared machine inflate absolute times; ratios compare calls in one process.",
        "",
    ])


if __name__ == "__main__":
    main()
