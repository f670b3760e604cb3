"""Functional twins: the same metrics for features held in memory, through the same code path."""

from __future__ import annotations

from torch import Tensor

from kdcollapse.metrics._statistics import collapse_metrics
from kdcollapse.metrics._ncc import ncc_accuracy
from kdcollapse.metrics._statistics import FeatureStatistics, check_batch
from kdcollapse.metrics._transfer import mean_log_odds_gain


def collapse_metrics_from_features(
    features: Tensor,
    labels: Tensor,
    num_classes: int,
    classifier_weight: Tensor | None = None,
    *,
    rtol: float | None = None,
    convention: str = "papyan",
    gnc_convention: str = "paper",
) -> dict[str, Tensor]:
    """:func:`~kdcollapse.metrics.collapse_metrics` of an ``(N, d)`` feature tensor with ``(N,)`` labels.

    One ``FeatureStatistics.update`` on the whole tensor; no cross-process sync. ``rtol`` and
    ``convention`` and ``gnc_convention`` as in ``FeatureStatistics``.

    >>> import torch
    >>> h = torch.tensor([[1.0, 0.0], [1.2, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    >>> m = collapse_metrics_from_features(h, torch.tensor([0, 0, 1, 2]), num_classes=3)
    >>> round(float(m["nc1"]), 6), int(m["rank_between"])
    (0.00293, 2)
    """
    check_batch(features, labels, num_classes, None)
    stats = FeatureStatistics(
        num_classes, features.shape[1], rtol=rtol, convention=convention, gnc_convention=gnc_convention,
        sync_on_compute=False,
    )
    stats.to(features.device).update(features, labels)
    return collapse_metrics(stats, classifier_weight)


__all__ = ["collapse_metrics_from_features", "mean_log_odds_gain", "ncc_accuracy"]
