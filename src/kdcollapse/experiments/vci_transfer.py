"""The VCI paper's §6.3 transfer measurement (Fig. 7) on a finished run, the study post step
``transfer_probes`` (results/collapse/vci_transfer/study.yaml): the variability-collapse metrics of the source
training features, and linear probes on three tasks the model never saw, summarised as the mean log-odds gain
(MLOG, eq. 6). Needs scikit-learn (``pip install 'kdcollapse[analysis]'``)."""

from __future__ import annotations

import functools
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kdcollapse._optional import require
from kdcollapse.data import load_dataset
from kdcollapse.metrics import FeatureStatistics, mean_log_odds_gain
from kdcollapse.runs import Run

C_GRID = np.logspace(-3, 3, 7)  # the probes' inverse L2 strength, chosen on each task's validation split
TASKS = ("fmnist5-9", "fmnist5-9_10shot", "digits")


def _standardised(images: torch.Tensor, mean: float, std: float) -> torch.Tensor:
    return (images.float() / 255 - mean) / std


@torch.no_grad()
def _features(model, x: torch.Tensor) -> torch.Tensor:
    model.eval()
    return torch.cat([model.forward_features(b) for b in x.split(1024)]).double()


@functools.lru_cache(maxsize=2)
def downstream_tasks(mean: float, std: float) -> dict[str, dict[str, tuple[torch.Tensor, torch.Tensor]]]:
    """Tasks never seen by a model pretrained on Fashion-MNIST classes 0-4, each with train / val (the probe's
    C) / test splits drawn with seed 0: Fashion-MNIST classes 5-9 with 100 and with 10 training images per class
    (validation: 100 per class of the training split; test: 400 per class of the test split), and the 8×8
    scikit-learn digits upsampled to 28×28 (half / quarter / quarter)."""
    load_digits = require("sklearn.datasets", "the VCI transfer probes (the digits task)").load_digits

    train = load_dataset("fashion_mnist", "train").select_classes([5, 6, 7, 8, 9])
    test = load_dataset("fashion_mnist", "test").select_classes([5, 6, 7, 8, 9]).subset(400, seed=0)
    pool = train.subset(200, seed=0)
    order = torch.randperm(len(pool), generator=torch.Generator().manual_seed(0))
    rows = {c: order[pool.labels[order] == c] for c in range(5)}

    def pick(a: int, b: int) -> torch.Tensor:
        return torch.cat([rows[c][a:b] for c in range(5)])

    x_f, x_test = _standardised(pool.inputs, mean, std), _standardised(test.inputs, mean, std)
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
    """Test accuracy (a fraction) of an L-BFGS logistic-regression probe on standardised features, C chosen on
    the task's validation split (the first of the best)."""
    LogisticRegression = require("sklearn.linear_model", "the VCI transfer probes").LogisticRegression  # noqa: N806
    StandardScaler = require("sklearn.preprocessing", "the VCI transfer probes").StandardScaler  # noqa: N806

    (xa, ya), (xv, yv), (xt, yt) = (task[s] for s in ("train", "val", "test"))
    scaler = StandardScaler().fit(_features(model, xa).numpy())
    fa, fv, ft = (scaler.transform(_features(model, x).numpy()) for x in (xa, xv, xt))
    best = max(C_GRID, key=lambda c: LogisticRegression(C=c, max_iter=2000).fit(fa, ya).score(fv, yv))
    return float(LogisticRegression(C=best, max_iter=2000).fit(fa, ya).score(ft, yt))


@torch.no_grad()
def transfer_probes(run_dir: Path) -> dict:
    """Of the run's last model: VCI, NC1, fuzziness, squared distance and within-class cosine distance of its
    training features (eval mode), its source test accuracy (%), each probe's test accuracy (``probe_<task>``,
    %) and the MLOG of the three probes over the source accuracy."""
    run = Run(run_dir)
    model, _ = run.model("model")
    train, test = run.dataset("train"), run.dataset("test")
    mean, std = train.mean[0], train.std[0]
    stats = FeatureStatistics(num_classes=train.num_classes, feature_dim=model.feature_dim)
    stats.update(_features(model, _standardised(train.inputs, mean, std)), train.labels)
    metrics = {k: float(v) for k, v in stats.compute().items()
               if k in ("vci", "nc1", "fuzziness", "squared_distance", "cosine_within")}
    logits = model.forward_head(_features(model, _standardised(test.inputs, mean, std)).float())
    source = float((logits.argmax(1) == test.labels).double().mean())
    downstream = {name: probe(model, task) for name, task in downstream_tasks(mean, std).items()}
    return {**metrics, "eval_test_acc": 100 * source,
            **{f"probe_{name.replace('-', '_')}": 100 * acc for name, acc in downstream.items()},
            "mlog": mean_log_odds_gain(list(downstream.values()), source)}
