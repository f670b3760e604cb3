"""The measurements of the GNC paper's network experiments on a finished run, the study post steps
``gnc_geometry`` (Fig. 2 and 3: GNC1-3 of the training features and the classifier rows, with the Thm 3.9
bounds; results/geometry/gnc_networks/study.yaml) and ``circle_geometry`` (Fig. B.1 and B.6, 2-d features: how
evenly the class means and the rows lie on the circle, and the angles within similar pairs;
results/geometry/gnc_2d/study.yaml, results/geometry/assignment/study.yaml). Accuracies in %."""

from __future__ import annotations

import math
from pathlib import Path

import torch

from kdcollapse.geometry import softmax_code_bounds
from kdcollapse.metrics import FeatureStatistics, collapse_metrics
from kdcollapse.runs import Run


@torch.no_grad()
def outputs(run: Run):
    """The run's last model in eval mode, its train and test splits, the training features and the test
    accuracy (images standardised with the run's mean and std, unaugmented)."""
    model, _ = run.model("model")
    model.eval()
    train, test = run.dataset("train"), run.dataset("test")
    norm = lambda d: (d.inputs.float() / 255 - d.mean[0]) / d.std[0]  # noqa: E731
    h = torch.cat([model.forward_features(b) for b in norm(train).split(1024)])
    test_logits = torch.cat([model(b) for b in norm(test).split(1024)])
    return model, train, h, float((test_logits.argmax(1) == test.labels).double().mean())


@torch.no_grad()
def gnc_geometry(run_dir: Path) -> dict:
    """GNC1-3 and NC1 of the run's last model (the training features, W = the head's rows), the Thm 3.9 bounds
    on the optimal GNC2 for its (K, d), and its accuracy in eval mode on the training and the test split (%)."""
    run = Run(run_dir)
    model, train, h, test_acc = outputs(run)
    stats = FeatureStatistics(num_classes=train.num_classes, feature_dim=h.shape[1])
    stats.update(h.double(), train.labels)
    m = collapse_metrics(stats, model.head.weight.detach().double())
    train_logits = model.forward_head(h)
    bounds = softmax_code_bounds(train.num_classes, h.shape[1])
    return {"gnc1": float(m["gnc1"]), "gnc2": float(m["gnc2"]), "gnc3": float(m["gnc3"]), "nc1": float(m["nc1"]),
            "gnc2_lower": bounds.lower, "gnc2_upper": bounds.upper,
            "eval_train_acc": 100 * float((train_logits.argmax(1) == train.labels).double().mean()),
            "eval_test_acc": 100 * test_acc}


def circle_gaps(vectors: torch.Tensor) -> tuple[float, float]:
    """Smallest and largest angle between circular neighbours of 2-d vectors, in units of 2π / K (1: evenly
    spaced)."""
    angles = torch.sort(torch.atan2(vectors[:, 1], vectors[:, 0])).values
    diffs = torch.diff(torch.cat([angles, angles[:1] + 2 * math.pi]))
    unit = 2 * math.pi / len(vectors)
    return float(diffs.min() / unit), float(diffs.max() / unit)


@torch.no_grad()
def circle_geometry(run_dir: Path) -> dict:
    """For a run with 2-d features: its test accuracy (%, eval mode), the spread of the class-mean norms and of
    the row norms (coefficient of variation; the features on the unit circle for the heads that normalise them),
    the smallest and largest gap between circular neighbours of the class means and of the rows
    (:func:`circle_gaps`); with K = 4 or 6 (two or three similar pairs, classes 2i and 2i + 1: the class-assignment
    page, Fig. B.6), the smallest and largest angle between the rows of a pair, in degrees."""
    run = Run(run_dir)
    model, train, h, test_acc = outputs(run)
    h, k = h.double(), train.num_classes
    if run.config.method.head != "linear":  # the cosine and fixed heads see the features on the unit circle
        h = torch.nn.functional.normalize(h, dim=1)
    means = torch.stack([h[train.labels == c].mean(0) for c in range(k)])
    norms = means.norm(dim=1)
    w = model.head.weight.detach().double()
    w_norms = w.norm(dim=1)
    row = {"eval_test_acc": 100 * test_acc,
           "mean_norm_cv": float(norms.std() / norms.mean()), "w_norm_cv": float(w_norms.std() / w_norms.mean()),
           "mean_gap_min": circle_gaps(means)[0], "mean_gap_max": circle_gaps(means)[1],
           "w_gap_min": circle_gaps(w)[0], "w_gap_max": circle_gaps(w)[1]}
    if k in (4, 6):
        unit = torch.nn.functional.normalize(w, dim=1)
        angles = [math.degrees(math.acos(max(-1.0, min(1.0, float(unit[a] @ unit[a + 1]))))) for a in range(0, k, 2)]
        row |= {"pair_angle_min_deg": min(angles), "pair_angle_max_deg": max(angles)}
    return row
