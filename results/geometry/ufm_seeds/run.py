"""Section A of results/geometry/ufm.md over several initialisations: does weight decay (GNC eq. B.1) reach the
softmax code when solved to convergence, against the paper's App. B.2 / Fig. B.1(c)?

Usage: PYTHONPATH=src python results/geometry/ufm_seeds/run.py [--seeds 0,1,2,3,4] [--out results/geometry/ufm_seeds]
Writes results.json and README-table.md (the table of the page) into --out.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

from kdcollapse.experiments.ufm import train_ufm
from kdcollapse.geometry import softmax_code_optimum

K, D, N = 30, 2, 2  # the setting of ufm.md section A
SETTINGS = {  # name: (regularization, temperature, optimizer, steps)
    "sphere, gd": ("sphere", 0.02, "gd", 5000),
    "weight decay, gd": ("weight_decay", 1.0, "gd", 5000),
    "sphere, lbfgs": ("sphere", 0.02, "lbfgs", 3000),
    "weight decay, lbfgs": ("weight_decay", 1.0, "lbfgs", 3000),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--out", default="results/geometry/ufm_seeds")
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    optimum = softmax_code_optimum(K, D)
    rows = {}
    start = time.perf_counter()
    for name, (reg, tau, opt, steps) in SETTINGS.items():
        for seed in seeds:
            res = train_ufm(K, D, N, regularization=reg, temperature=tau, weight_decay=5e-4, optimizer=opt,
                            steps=steps, lr=0.1, log_every=steps, seed=seed)
            norms = res.W.norm(dim=1)
            rows.setdefault(name, []).append({"seed": seed, **{k: float(v) for k, v in res.final.items()},
                                              "norm_ratio": float(norms.max() / norms.min())})
            print(name, seed, f"gnc2 {rows[name][-1]['gnc2']:.5f}", flush=True)
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    meta = {"K": K, "d": D, "n": N, "optimum": optimum, "seeds": seeds, "seconds": time.perf_counter() - start,
            "machine": f"{platform.machine()} {platform.processor()}", "torch": torch.__version__,
            "revision": revision}
    (out / "results.json").write_text(json.dumps({"meta": meta, "runs": rows}, indent=1) + "\n")
    lines = ["| UFM, optimizer | GNC2 per seed | mean ± std | reaches the code (GNC2 ≥ 0.99 × optimum) |",
             "| --- | --- | --- | --- |"]
    for name, runs in rows.items():
        g = [r["gnc2"] for r in runs]
        hit = sum(v >= 0.99 * optimum for v in g)
        lines.append(f"| {name} | {', '.join(f'{v:.5f}' for v in g)} | {statistics.mean(g):.5f} ± "
                     f"{statistics.stdev(g) if len(g) > 1 else 0:.5f} | {hit} / {len(g)} |")
    (out / "README-table.md").write_text("\n".join(lines) + f"\n\nsoftmax-code optimum: {optimum:.5f}\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
