"""NC4's nearest class mean: float32 screening with a float64 re-check of near ties against the float64 computation
it replaced, in the same process (CPU time of one thread each, best of --repeats). Prints one JSON line.

    OMP_NUM_THREADS=1 python benchmarks/bench_ncc_screen.py --classes 10000 --dim 256 --rows 4096
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from kdcollapse.metrics import nearest_class_mean


def float64_nearest(features, means):
    centre = means.mean(0)
    centred = means - centre
    norms = centred.square().sum(1)
    out = torch.empty(features.shape[0], dtype=torch.int64)
    for block in torch.arange(features.shape[0]).split(max(1, 2**24 // len(means))):
        out[block] = (norms - 2 * (features[block].double() - centre) @ centred.mT).argmin(1)
    return out


def best(fn, repeats):
    times = []
    for _ in range(repeats):
        start = time.process_time()
        result = fn()
        times.append(time.process_time() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--classes", type=int, default=10000)
    parser.add_argument("--dim", type=int, default=256)
    parser.add_argument("--rows", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    means = torch.randn(args.classes, args.dim, generator=g, dtype=torch.float64)
    features = means[torch.randint(0, args.classes, (args.rows,), generator=g)] + torch.randn(
        args.rows, args.dim, generator=g, dtype=torch.float64)
    old_s, old = best(lambda: float64_nearest(features, means), args.repeats)
    new_s, new = best(lambda: nearest_class_mean(features, means), args.repeats)
    print(json.dumps({"cpu_capability": torch.backends.cpu.get_cpu_capability(), "classes": args.classes,
                      "dim": args.dim, "rows": args.rows, "float64_s": round(old_s, 3), "screened_s": round(new_s, 3),
                      "ratio_float64_over_screened": round(old_s / new_s, 2), "equal": bool(torch.equal(old, new))}))


if __name__ == "__main__":
    main()
