"""Streaming collapse statistics at scale: time against this CPU's matmul, and memory flat in N.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_metrics.py            # N = 1e5 and 1e6
    PYTHONPATH=src python benchmarks/bench_metrics.py --n 20000 --naive-n 20000    # a quick look

Every case runs in a fresh child process, so its peak resident memory (``ru_maxrss``, which counts
torch's and numpy's allocations alike) belongs to that case alone. Features (float32, d = 512, K = 1000
Gaussian classes) are generated batch by batch and never stored by the streaming case. Inside the same
child it times, batch by batch, the bare float64 ``X.T @ X`` of the batch shape: the baseline every ratio
is taken against. Then, on one full batch, it times the parts of ``update`` (validation, the two d x d
accumulations, the rest) and ``update`` with its element-wise work on the whole batch at once instead of
in cache-sized blocks, each against the bare matmul, in interleaved rounds. The naive case holds every
feature in memory and computes NC1 and VCI the two-pass way in float64 with numpy (``np.linalg.pinv``), as
all-in-memory implementations do.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

SEED = 0
# wall: time.perf_counter; cpu: this process's CPU time, which a shared machine's other jobs do not add to
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def batches(n: int, batch: int, dim: int, classes: int):
    """The same float32 features and labels for every case: class means + unit Gaussian noise."""
    import torch

    g = torch.Generator().manual_seed(SEED)
    means = torch.randn(classes, dim, generator=g) * 0.5
    for start in range(0, n, batch):
        size = min(batch, n - start)
        labels = torch.randint(classes, (size,), generator=g)
        yield means[labels] + torch.randn(size, dim, generator=g), labels


def peak_rss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def streaming(args) -> dict:
    import torch

    from kdcollapse.metrics import FeatureStatistics

    torch.set_num_threads(args.threads)
    stats = FeatureStatistics(args.classes, args.dim)
    x, y = next(batches(args.batch, args.batch, args.dim, args.classes))
    stats.update(x, y)  # warm-up: BLAS, allocator
    stats.reset()
    rss_ready = peak_rss_mib()

    clock = CLOCKS[args.clock]
    update_s = bare_s = 0.0
    for x, y in batches(args.n, args.batch, args.dim, args.classes):
        start = clock()
        stats.update(x, y)
        update_s += clock() - start
        x64 = x.double()
        start = clock()
        x64.T @ x64
        bare_s += clock() - start
    start = time.perf_counter()
    metrics = stats.compute()
    compute_s = time.perf_counter() - start

    part = parts(args, *next(batches(args.batch, args.batch, args.dim, args.classes)))
    gram_s, matmul_s = part["gram"], part["bare"]
    return part | {
        "update_s": update_s,
        "bare_matmul_s": bare_s,
        "compute_s": compute_s,
        "gram_s": gram_s,
        "matmul_s": matmul_s,
        "gram_gflops": args.batch * args.dim * (args.dim + 1) / gram_s / 1e9,  # flops syrk performs
        "matmul_gflops": 2 * args.batch * args.dim**2 / matmul_s / 1e9,
        "rss_ready_mib": rss_ready,
        "peak_rss_mib": peak_rss_mib(),
        "nc1": float(metrics["nc1"]),
        "vci": float(metrics["vci"]),
    }


def parts(args, x, y, rounds: int = 21) -> dict:
    """Per-batch seconds (median of ``rounds`` rounds, the cases in a shuffled order each round) of ``update``
    on the full batch ``x`` and of its parts: validation (``check_batch``), one of its two d x d accumulations
    (``_add_gram``, BLAS ``dsyrk`` on CPU), ``update`` with its element-wise work on the whole batch at once
    (one block: how it ran before BLOCK_ELEMENTS), and the bare float64 ``X.T @ X`` of the batch."""
    import torch

    from _timing import interleave

    from kdcollapse.metrics import FeatureStatistics
    from kdcollapse.metrics import _statistics

    stats = FeatureStatistics(args.classes, args.dim)
    stats.update(x, y)  # past the first batch, which also forms the shifts
    x64 = x.double()
    z = x64 - x64.mean(0)
    moment = torch.zeros(args.dim, args.dim, dtype=torch.float64)
    blocks = _statistics.BLOCK_ELEMENTS

    clock = CLOCKS[args.clock]

    def timed(fn):
        def timer() -> float:
            start = clock()
            fn()
            return clock() - start
        return timer

    def one_block() -> None:
        _statistics.BLOCK_ELEMENTS = x.numel()
        try:
            stats.update(x, y)
        finally:
            _statistics.BLOCK_ELEMENTS = blocks

    timers = {
        "bare": timed(lambda: x64.T @ x64),
        "update": timed(lambda: stats.update(x, y)),
        "update_one_block": timed(one_block),
        "check": timed(lambda: _statistics.check_batch(x, y, args.classes, args.dim)),
        "gram": timed(lambda: _statistics._add_gram(moment, z)),
    }
    for timer in timers.values():  # warm-up
        timer()
    return interleave(timers, rounds) | {"block_elements": blocks}


def naive(args) -> dict:
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    rss_ready = peak_rss_mib()
    start = time.perf_counter()
    parts = list(batches(args.n, args.batch, args.dim, args.classes))
    h = torch.cat([x for x, _ in parts]).numpy()
    y = torch.cat([labels for _, labels in parts]).numpy()
    del parts
    gen_s = time.perf_counter() - start

    start = time.perf_counter()
    hd = h.astype(np.float64)
    means = np.stack([hd[y == k].mean(0) for k in range(args.classes)])
    mu_g = hd.mean(0)
    within_dev = hd - means[y]
    sigma_w = within_dev.T @ within_dev / len(hd)
    total_dev = hd - mu_g
    sigma_t = total_dev.T @ total_dev / len(hd)
    prior = np.bincount(y, minlength=args.classes) / len(hd)
    sigma_b = (means - mu_g).T @ ((means - mu_g) * prior[:, None])  # prior-weighted, about mu_G: VCI's
    centred = means - means.mean(0)  # NC1's default ("papyan") convention: each class once, about the mean of the means
    nc1 = np.trace(sigma_w @ np.linalg.pinv(centred.T @ centred / args.classes)) / args.classes
    vci = 1 - np.trace(np.linalg.pinv(sigma_t) @ sigma_b) / min(args.dim, args.classes - 1)
    return {
        "generate_s": gen_s,
        "naive_s": time.perf_counter() - start,
        "rss_ready_mib": rss_ready,
        "peak_rss_mib": peak_rss_mib(),
        "nc1": float(nc1),
        "vci": float(vci),
    }


def run_child(case: str, n: int, args) -> dict:
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, OPENBLAS_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    command = [sys.executable, __file__, "--child", case, "--n", str(n), "--dim", str(args.dim),
               "--classes", str(args.classes), "--batch", str(args.batch), "--threads", threads, "--clock", args.clock]
    out = subprocess.run(command, env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100_000, 1_000_000], help="streamed features")
    parser.add_argument("--naive-n", type=int, default=100_000, help="naive case's N")
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--classes", type=int, default=1000)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--threads", type=int, default=1, help="torch and BLAS threads in every case")
    parser.add_argument("--clock", choices=sorted(CLOCKS), default="wall",
                        help="what the update and matmul times measure (cpu: this process's CPU time)")
    parser.add_argument("--child", choices=["streaming", "naive"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        n, args.n = args.n[0], args.n[0]
        print(json.dumps((streaming if args.child == "streaming" else naive)(args) | {"n": n}))
        return

    from _timing import cpu_capability, cpu_model

    print(f"{cpu_model()}, CPU capability {cpu_capability()}, {os.cpu_count()} cores")
    print(f"load average before: {os.getloadavg()}; d={args.dim} K={args.classes} batch={args.batch} "
          f"threads={args.threads} clock={args.clock}")
    print("| case | N | time (s) | x bare matmul | peak RSS (MiB) | RSS ready (MiB) | nc1 | vci |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    results = []
    for n in args.n:
        r = run_child("streaming", n, args)
        results.append(r)
        ratio = r["update_s"] / r["bare_matmul_s"]
        print(f"| streaming update | {n:,} | {r['update_s']:.2f} | {ratio:.2f} | {r['peak_rss_mib']:.0f} | "
              f"{r['rss_ready_mib']:.0f} | {r['nc1']:.6g} | {r['vci']:.6g} |")
        print(f"| bare X.T @ X (same batches) | {n:,} | {r['bare_matmul_s']:.2f} | 1.00 | | | | |")
        print(f"| compute() | {n:,} | {r['compute_s']:.2f} | | | | | |")
    r = run_child("naive", args.naive_n, args)
    print(f"| naive numpy, all in memory | {args.naive_n:,} | {r['naive_s']:.2f} | | "
          f"{r['peak_rss_mib']:.0f} | {r['rss_ready_mib']:.0f} | {r['nc1']:.6g} | {r['vci']:.6g} |")
    g = results[-1]
    ms = {name: g[name] * 1e3 for name in ("bare", "update", "update_one_block", "check", "gram")}
    rest = ms["update"] - ms["check"] - 2 * ms["gram"]
    print(f"\nParts of one update, batch {args.batch} x {args.dim} (median of interleaved rounds, ms; "
          f"x the bare matmul of the batch):")
    print("| part | ms | x bare matmul |")
    print("|---|---:|---:|")
    for name, value in (("update (element-wise work in blocks of "
                         f"{g['block_elements']:,} elements)", ms["update"]),
                        ("validation (check_batch)", ms["check"]),
                        ("two d x d accumulations (2 x dsyrk)", 2 * ms["gram"]),
                        ("the rest: float64 copy, norms, centring, squares, class sums", rest),
                        ("update with the element-wise work on the whole batch at once", ms["update_one_block"]),
                        ("bare float64 X.T @ X", ms["bare"])):
        print(f"| {name} | {value:.1f} | {value / ms['bare']:.2f} |")
    print(f"\ndsyrk {g['gram_gflops']:.1f} GFLOP/s of the flops it does, bare X.T @ X {g['matmul_gflops']:.1f} GFLOP/s; "
          f"one dsyrk / bare matmul {g['gram_s'] / g['matmul_s']:.2f}")
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()
