"""GNC paper Fig. 2 (GNC1-3 and accuracy vs the temperature tau) and Fig. 3 (vs the feature dimension
d < K - 1, with the Thm 3.9 bounds) on fashion_mnist_pairs (K = 100) at CPU scale: an MLP with a linear
bottleneck of width d and a cosine classifier (method ``spherical``, head ``cosine``). Writes
results/geometry/gnc_networks/runs.json, one row per run.

    PYTHONPATH=src python results/geometry/gnc_networks/study.py [--seeds 0,1,2] [--out /work/runs/gnc_networks]
        [--terminal]

``--terminal``: both sweeps trained into the terminal phase (TERMINAL: 200 epochs, the gradient's norm clipped
at 1 so that small tau trains at all; the d-sweep at TERMINAL["tau"]); rows go to runs_terminal.json and runs
to OUT/terminal.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from kdcollapse.config import config_from_dict
from kdcollapse.experiments.gnc_networks import config, grid, measure
from kdcollapse.runs import Run
from kdcollapse.train import fit

HERE = Path(__file__).parent


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--out", default="/work/runs/gnc_networks")
    parser.add_argument("--terminal", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = HERE / ("runs_terminal.json" if args.terminal else "runs.json")
    out = Path(args.out) / "terminal" if args.terminal else Path(args.out)
    rows = json.loads(path.read_text()) if path.exists() else []
    done = {(r["tau"], r["dim"], r["seed"]) for r in rows}
    for seed in (int(s) for s in args.seeds.split(",")):
        for tau, dim in grid(args.terminal):
            if (tau, dim, seed) in done:
                continue
            run_dir = out / f"tau{tau:g}_d{dim}" / f"seed{seed}"
            if not (run_dir.is_dir() and Run(run_dir).finished()):
                fit(config_from_dict(config(run_dir, seed, tau, dim, args.terminal)), overwrite=True)
            row = {"tau": tau, "dim": dim, "seed": seed, **measure(Run(run_dir))}
            rows.append(row)
            path.write_text(json.dumps(rows, indent=1))
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
