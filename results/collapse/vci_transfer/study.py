"""VCI paper §6.3 (Fig. 7) at CPU scale: pretrain a τ family and a λ family on Fashion-MNIST classes 0-4,
measure the variability-collapse metrics on the source training features, and transfer by linear probes on
tasks the models never saw. Writes results/collapse/vci_transfer/runs.json (one row per model).

    PYTHONPATH=src python results/collapse/vci_transfer/study.py [--seeds 0,1,2] [--out /work/runs/vci_transfer]

Finished runs (a model.safetensors in their directory) are not retrained.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.linear_model import LogisticRegression
from sklearn.preprocessing import StandardScaler

from kdcollapse.config import config_from_dict
from kdcollapse.data import load_dataset
from kdcollapse.metrics import FeatureStatistics, mean_log_odds_gain
from kdcollapse.runs import Run
from kdcollapse.train import fit

HERE = Path(__file__).parent
TAUS = (0.1, 0.2, 0.4, 0.6, 0.8, 1.0)  # the paper's Table 1 values
LAMBDAS = (2.5, 3.75, 5.0, 7.5, 10.0)  # the paper's Table 1 values, at tau = 1
C_GRID = np.logspace(-3, 3, 7)  # probe L2 strength, chosen on each task's validation split


def family() -> list[tuple[str, dict]]:
    members = [(f"tau{t:g}", {"temperature": t}) for t in TAUS]
    return members + [(f"lambda{lam:g}", {"cosine_weight": lam}) for lam in LAMBDAS]


def config(run_dir: Path, seed: int, method: dict) -> dict:
    return {
        "run_dir": str(run_dir), "seed": seed,
        "data": {"name": "fashion_mnist", "classes": [0, 1, 2, 3, 4], "train_per_class": 600,
                 "val_per_class": 100, "test_per_class": 400, "batch_size": 128},
        "model": {"name": "mlp", "kwargs": {"hidden": [256, 64]}},
        "method": {"name": "vanilla", **method},
        "optim": {"lr": 0.02, "momentum": 0.9, "weight_decay": 5e-4},
        "schedule": {"name": "cosine"},
        "train": {"epochs": 10, "progress": False, "device": "cpu"},
    }


def standardised(images: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    return (images.float() / 255 - mean) / std


@torch.no_grad()
def features(model, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    return torch.cat([model.forward_features(b) for b in x.split(1024)]).double()


def downstream_tasks(mean: float, std: float) -> dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Tasks never seen in pretraining: Fashion-MNIST classes 5-9 (100 and 10 training images per class),
    and the 8x8 sklearn digits upsampled to 28x28. Each: train / val (choice of C) / test."""
    train = load_dataset("fashion_mnist", "train").select_classes([5, 6, 7, 8, 9])
    test = load_dataset("fashion_mnist", "test").select_classes([5, 6, 7, 8, 9]).subset(400, seed=0)
    pool = train.subset(200, seed=0)
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(0))
    rows = {c: order[pool.labels[order] == c] for c in range(5)}
    pick = lambda a, b: torch.cat([rows[c][a:b] for c in range(5)])  # noqa: E731
    x_f = standardised(pool.inputs, mean, std)
    x_test = standardised(test.inputs, mean, std)
    tasks = {}
    for name, n in (("fmnist5-9", 100), ("fmnist5-9_10shot", 10)):
        tasks[name] = {"train": (x_f[pick(0, n)], pool.labels[pick(0, n)]),
                       "val": (x_f[pick(100, 200)], pool.labels[pick(100, 200)]),
                       "test": (x_test, test.labels)}
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32)[:, None] / 16  # [0, 1]
    images = F.interpolate(images, size=(28, 28), mode="bilinear", align_corners=False)
    x_d, y_d = (images - mean) / std, torch.tensor(digits.target)
    perm = torch.randperm(len(y_d), generator=torch.Generator().manual_seed(0))
    cut = [0, len(perm) // 2, 3 * len(perm) // 4, len(perm)]
    tasks["digits"] = {s: (x_d[perm[a:b]], y_d[perm[a:b]]) for s, a, b in zip(("train", "val", "test"), cut, cut[1:])}
    return tasks


def probe(model, task) -> float:
    """Test accuracy of an L-BFGS logistic-regression probe on standardised features, C chosen on val."""
    (xa, ya), (xv, yv), (xt, yt) = (task[s] for s in ("train", "val", "test"))
    scaler = StandardScaler().fit(features(model, xa).numpy())
    fa, fv, ft = (scaler.transform(features(model, x).numpy()) for x in (xa, xv, xt))
    best = max(C_GRID, key=lambda c: LogisticRegression(C=c, max_iter=2000).fit(fa, ya).score(fv, yv))
    return float(LogisticRegression(C=best, max_iter=2000).fit(fa, ya).score(ft, yt))


def measure(run: Run, tasks) -> dict:
    model, _ = run.model("model")
    train, test = run.dataset("train"), run.dataset("test")
    mean, std = train.mean[0], train.std[0]
    stats = FeatureStatistics(num_classes=train.num_classes, feature_dim=model.feature_dim)
    stats.update(features(model, standardised(train.inputs, mean, std)), train.labels)
    metrics = {k: float(v) for k, v in stats.compute().items()
               if k in ("vci", "nc1", "fuzziness", "squared_distance", "cosine_within")}
    with torch.no_grad():
        logits = model.forward_head(features(model, standardised(test.inputs, mean, std)).float())
    source_acc = float((logits.argmax(1) == test.labels).double().mean())
    downstream = {name: probe(model, task) for name, task in tasks.items()}
    return {**metrics, "source_test_acc": source_acc, "downstream": downstream,
            "mlog": mean_log_odds_gain(list(downstream.values()), source_acc)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--out", default="/work/runs/vci_transfer")
    args = parser.parse_args()
    torch.set_num_threads(1)
    path = HERE / "runs.json"
    rows = json.loads(path.read_text()) if path.exists() else []
    done = {(r["member"], r["seed"]) for r in rows}
    tasks = None
    for seed in (int(s) for s in args.seeds.split(",")):
        for member, method in family():
            if (member, seed) in done:
                continue
            run_dir = Path(args.out) / member / f"seed{seed}"
            if not (run_dir.is_dir() and Run(run_dir).finished()):
                fit(config_from_dict(config(run_dir, seed, method)), overwrite=True)
            run = Run(run_dir)
            if tasks is None:
                train = run.dataset("train")
                tasks = downstream_tasks(train.mean[0], train.std[0])
            row = {"member": member, "family": "tau" if member.startswith("tau") else "lambda", "seed": seed,
                   **method, **measure(run, tasks)}
            rows.append(row)
            path.write_text(json.dumps(rows, indent=1))
            print(json.dumps(row), flush=True)
            if not math.isfinite(row["mlog"]):
                raise SystemExit(f"non-finite MLOG for {member} seed {seed}")


if __name__ == "__main__":
    main()
