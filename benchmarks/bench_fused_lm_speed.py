"""Time of the fused head loss against the unfused loss, repeated and interleaved in one process, with the
peak memory of each (issue 39, item 6: fused ≤ 1.05× the unfused time at N ≥ 2048, peak ≤ 0.2× at N = 8192).

The losses are those of ``bench_fused_lm_losses.py`` (forward KL + 0.5·CE from hidden states, the teacher's
own head, one forward + backward) with the fused loss at each ``--chunks`` size. Each repeat times every
variant once, in an order rotated from repeat to repeat, so a change in the machine's load reaches all of
them alike; the table gives the medians and the ratio of medians. Peaks are measured once per variant with
the profiler (``bench_loss_memory.peak_mib``: the inputs are not counted, the gradients of h and W are).

    OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/bench_fused_lm_speed.py \\
        --cells 2048,49152,576 8192,49152,576 --repeats 5 --markdown results/benchmarks/fused_lm_speed.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from functools import partial
from pathlib import Path

import torch

from _timing import shared_machine  # benchmarks/_timing.py
from bench_fused_lm_losses import fits, inputs, unfused  # benchmarks/bench_fused_lm_losses.py
from bench_loss_memory import peak_mib  # benchmarks/bench_loss_memory.py
from kdcollapse.losses import TeacherHead, fused_head_loss


def fused(hidden, weight, t_hidden, t_weight, labels, *, chunk: int):
    return fused_head_loss(hidden, weight, TeacherHead(t_hidden, t_weight), labels=labels, ce_weight=0.5,
                           chunk_size=chunk)


def seconds(loss_fn, tensors) -> float:
    hidden, weight = tensors[:2]
    hidden.grad = weight.grad = None
    start = time.perf_counter()
    loss_fn(*tensors).backward()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cells", nargs="+", metavar="N,V,H", default=["2048,49152,576"])
    parser.add_argument("--chunks", nargs="+", type=int, default=[1024, 256])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--memory-share", type=float, default=0.35,
                        help="run the unfused loss only where it needs less than this share of the free memory")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    load_before = os.getloadavg()[0]
    small = inputs(512, 4096, 64, dtype)  # warm-up: no measured call is a process's first
    for fn in (unfused, partial(fused, chunk=256)):
        seconds(fn, small)
        peak_mib(lambda *_: fn(*small), small[0], None, None)
    rows = []
    for cell in args.cells:
        n, v, h = map(int, cell.split(","))
        tensors = inputs(n, v, h, dtype)
        variants = {f"fused, chunk {c}": partial(fused, chunk=c) for c in args.chunks}
        if fits(n, v, args.memory_share):
            variants["unfused"] = unfused
        times = {name: [] for name in variants}
        names = list(variants)
        for r in range(args.repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(seconds(variants[name], tensors))
        peaks = {name: peak_mib(lambda *_, fn=fn: fn(*tensors), tensors[0], None, None) for name, fn in variants.items()}
        row = {"n": n, "v": v, "h": h, "median": {k: statistics.median(t) for k, t in times.items()},
               "spread": {k: (min(t), max(t)) for k, t in times.items()}, "peak": peaks}
        rows.append(row)
        for name in variants:
            print(f"N={n} V={v} H={h} {name}: median {row['median'][name]:.2f} s "
                  f"(min {row['spread'][name][0]:.2f}, max {row['spread'][name][1]:.2f}), peak {peaks[name]:.0f} MiB"
                  + (f"; time {row['median'][name] / row['median']['unfused']:.3f}x, peak "
                     f"{peaks[name] / peaks['unfused']:.3f}x the unfused" if "unfused" in variants else ""),
                  flush=True)
        del tensors
    if args.markdown:
        args.markdown.write_text(render(rows, args, (load_before, os.getloadavg()[0])))


def render(rows: list[dict], args, load: tuple[float, float]) -> str:
    table = ["| N | V | H | loss | median time (min–max) | **time / unfused** | peak | **peak / unfused** |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        base_t, base_p = r["median"].get("unfused"), r["peak"].get("unfused")
        for name, t in r["median"].items():
            lo, hi = r["spread"][name]
            ratio_t = f"**{t / base_t:.3f}×**" if base_t else "—"
            ratio_p = f"**{r['peak'][name] / base_p:.3f}×**" if base_p else "unfused not run"
            table.append(f"| {r['n']} | {r['v']:,} | {r['h']} | {name} | {t:.2f} s ({lo:.2f}–{hi:.2f}) | {ratio_t} | "
                         f"{r['peak'][name]:.0f} MiB | {ratio_p} |")
    command = ("OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/bench_fused_lm_speed.py --cells "
               + " ".join(args.cells) + " --chunks " + " ".join(map(str, args.chunks))
               + f" --repeats {args.repeats} --dtype {args.dtype} --markdown results/benchmarks/fused_lm_speed.md")
    return "\n".join(["# Fused head loss: time and peak memory against the unfused loss", "",
                      shared_machine(load) + f", CPU capability {torch.backends.cpu.get_cpu_capability()}, "
                      f"{args.dtype}, {args.repeats} interleaved repeats per loss, one process.",
                      f"Command: `{command}`.", "", *table, ""])


if __name__ == "__main__":
    main()
