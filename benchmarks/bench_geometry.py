"""Benchmark: exact one-vs-rest distances against the paper's projected gradient descent, and softmax codes.

    python benchmarks/bench_geometry.py --markdown results/benchmarks/bench_geometry.md        # full (minutes)
    python benchmarks/bench_geometry.py --quick                                       # smoke run

1. ``one_vs_rest_distances`` on random unit rows and on a clustered ("trained-like": classes grouped
   around semantic super-classes, as GNC Section 4 observes) classifier, K = 1,000 / d = 64 and
   K = 10,000 / d = 512: wall and CPU time, peak resident memory, largest certified gap.
2. The GNC paper's approach on the same instances: projected gradient descent on the simplex, 10,000
   steps of size 1/L from a random start, per class -- run on a subset of classes (all in one batch)
   and extrapolated linearly to K classes; its error is measured against our certified distances.
3. ``softmax_code(100, 10)``: each restart timed; time until a restart is within 1 % of the best value
   over all restarts.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
from kdcollapse.geometry import one_vs_rest_distances, softmax_code, softmax_code_bounds  # noqa: E402
from kdcollapse.geometry._distances import unit_rows  # noqa: E402
from kdcollapse.distributed import cpu_capability  # noqa: E402
from _timing import cpu_model, emit  # noqa: E402  (benchmarks/_timing.py)

PGD_STEPS = 10_000  # the paper's official code: 10,000 projected-gradient steps per class


def clustered(K: int, d: int, generator: torch.Generator, groups: int = 100, spread: float = 0.6) -> torch.Tensor:
    """K classes around ``groups`` random super-class directions (within-group cosine ~ 1/(1+spread^2))."""
    centres = torch.randn(groups, d, generator=generator, dtype=torch.float64)
    centres = centres / centres.norm(dim=1, keepdim=True)
    noise = torch.randn(K, d, generator=generator, dtype=torch.float64) / math.sqrt(d)
    return unit_rows(centres[torch.arange(K) % groups] + spread * noise)


def instances(sizes, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    for K, d in sizes:
        yield f"random K={K} d={d}", unit_rows(torch.randn(K, d, generator=g, dtype=torch.float64))
        yield f"clustered K={K} d={d}", clustered(K, d, g)


def reset_peak_memory() -> None:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM (Linux)
    except OSError:
        pass


def peak_memory_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def project_simplex(v: torch.Tensor) -> torch.Tensor:
    """Euclidean projection of each row onto the probability simplex (sort-based, Held et al. 1974)."""
    u = v.sort(dim=1, descending=True).values
    cumulative = u.cumsum(1) - 1
    index = torch.arange(1, v.shape[1] + 1, device=v.device, dtype=v.dtype)
    rho = ((u - cumulative / index) > 0).sum(1, keepdim=True)
    theta = cumulative.gather(1, rho - 1) / rho
    return (v - theta).clamp_min(0)


def projected_gradient(W: torch.Tensor, classes: torch.Tensor, steps: int, seed: int = 0) -> torch.Tensor:
    """The paper's approach: min ||w_k - sum lambda_j w_j||^2 by projected gradient from a random start."""
    g = torch.Generator().manual_seed(seed)
    b = len(classes)
    rows = torch.arange(b)
    step = 1 / (2 * torch.linalg.matrix_norm(W, ord=2).item() ** 2)  # 1/L, L = 2 sigma_max(W)^2 >= 2 sigma_max(W_-k)^2
    lam = torch.rand(b, len(W), generator=g, dtype=W.dtype)
    lam[rows, classes] = 0
    lam /= lam.sum(1, keepdim=True)
    for _ in range(steps):
        grad = 2 * (lam @ W - W[classes]) @ W.T
        v = lam - step * grad
        v[rows, classes] = -1e9  # keep lambda_k = 0: class k is not in the hull of the others
        lam = project_simplex(v)
    return (W[classes] - lam @ W).norm(dim=1)


def bench_distances(sizes, pgd_classes: dict[int, int]) -> list[str]:
    rows = [
        "| instance | rho (min distance) | largest gap | wall s | CPU s | peak RSS increase MB | PGD classes run | PGD CPU s/class "
        "| PGD extrapolated CPU s | speed-up (CPU) | PGD max error | PGD median error |",
        "|" + " --- |" * 12,
    ]
    for name, W in instances(sizes):
        K = len(W)
        reset_peak_memory()
        before = peak_memory_mb()
        wall, cpu = time.perf_counter(), time.process_time()
        dist, gap = one_vs_rest_distances(W, return_certificate=True)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        peak = peak_memory_mb() - before
        subset = torch.randperm(K, generator=torch.Generator().manual_seed(1))[: pgd_classes[K]]
        t = time.process_time()
        pgd = projected_gradient(W, subset, PGD_STEPS)
        per_class = (time.process_time() - t) / len(subset)
        error = pgd - dist[subset]
        rows.append(
            f"| {name} | {dist.min().item():.6f} | {gap.max().item():.1e} | {wall:.1f} | {cpu:.1f} | {peak:.0f} | "
            f"{len(subset)} | {per_class:.2f} | {per_class * K:.0f} | {per_class * K / cpu:.0f}x | "
            f"{error.max().item():.1e} | {error.median().item():.1e} |"
        )
        print(rows[-1], flush=True)
    return rows


def bench_softmax_code(K: int, d: int, restarts: int) -> list[str]:
    values, times = [], []
    for seed in range(restarts):
        t = time.process_time()
        values.append(softmax_code(K, d, restarts=1, seed=seed).one_vs_rest)
        times.append(time.process_time() - t)
        print(f"softmax_code({K}, {d}) seed {seed}: rho={values[-1]:.6f} in {times[-1]:.1f} CPU s", flush=True)
    best = max(values)
    first = next(i for i, v in enumerate(values) if v >= 0.99 * best)
    b = softmax_code_bounds(K, d)
    return [
        "| restarts | best rho | worst rho | mean CPU s/restart | CPU time to within 1 % of best | Thm 3.9 bounds |",
        "|" + " --- |" * 6,
        f"| {restarts} | {best:.6f} | {min(values):.6f} | {sum(times) / restarts:.1f} | {sum(times[: first + 1]):.1f} s "
        f"(restart {first + 1}) | [{b.lower:.4f}, {b.upper:.4f}] |",
        "",
        "Per restart (seed: rho, CPU seconds): " + ", ".join(f"{s}: {v:.5f}, {t:.1f}" for s, (v, t) in enumerate(zip(values, times))),
    ]


def machine() -> str:
    return (f"{cpu_model()}, {os.cpu_count()} cores, CPU capability {cpu_capability()}, torch {torch.__version__} with "
            f"{torch.get_num_threads()} thread(s), Python {sys.version.split()[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--restarts", type=int, default=8, help="softmax_code restarts")
    parser.add_argument("--markdown", type=Path, help="write the results here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    sizes = [(200, 16)] if args.quick else [(1000, 64), (10_000, 512)]
    pgd_classes = {200: 10, 1000: 50, 10_000: 4}
    load = os.getloadavg()
    start, cpu_start = time.perf_counter(), time.process_time()
    distances = bench_distances(sizes, pgd_classes)
    code = bench_softmax_code(20, 4, 2) if args.quick else bench_softmax_code(100, 10, args.restarts)
    command = "python benchmarks/bench_geometry.py " + " ".join(sys.argv[1:])
    lines = [
        "# Geometry benchmark",
        "",
        f"Machine: {machine()}. Load average before: {load[0]:.1f} / {load[1]:.1f} / {load[2]:.1f}, after: "
        f"{os.getloadavg()[0]:.1f} (the 2 cores are shared with other jobs: CPU seconds are the steadier figure).",
        f"Command: `{command}`; one run of each case; total {time.perf_counter() - start:.0f} s wall, "
        f"{time.process_time() - cpu_start:.0f} CPU s.",
        "",
        "## one_vs_rest_distances vs the paper's projected gradient descent (10,000 steps per class)",
        "",
        "PGD runs on a random subset of classes (all in one batch) and is extrapolated linearly to all K classes;",
        "its error is PGD distance minus our certified distance (a positive error: PGD has not converged).",
        "Speed-up = extrapolated PGD CPU time / our CPU time (CPU time is steady under the shared load; wall is not).",
        "",
        *distances,
        "",
        "## softmax_code(100, 10)" if not args.quick else "## softmax_code(20, 4)",
        "",
        *code,
        "",
    ]
    text = "\n".join(lines)
    emit(text, args.markdown)


if __name__ == "__main__":
    main()
