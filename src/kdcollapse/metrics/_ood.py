"""``FeatureMean``: the mean feature of a data set streamed batch by batch, e.g. of out-of-distribution data for
NC5 (``collapse_metrics(..., ood_mean=...)``, NECO, Ammar et al. 2024)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from kdcollapse.metrics._metric import Metric

from kdcollapse.errors import KdcollapseError


class FeatureMean(Metric):
    """Mean of ``(B, d)`` feature batches over all their rows (float64 sum about the first batch's mean, so
    features far from the origin do not lose digits; summed across processes like every state here).

    >>> mean = FeatureMean(2)
    >>> mean.update(torch.tensor([[1.0, 2.0], [3.0, 2.0]]))
    >>> mean.compute().tolist()
    [2.0, 2.0]
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, feature_dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(feature_dim, int) or feature_dim < 1:
            raise KdcollapseError(f"feature_dim must be a positive integer, got {feature_dim!r}")
        self.feature_dim = feature_dim
        self.add_state("total", torch.zeros(feature_dim, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, features: Tensor) -> None:
        if not isinstance(features, Tensor) or features.ndim != 2 or features.shape[1] != self.feature_dim:
            shape = tuple(features.shape) if isinstance(features, Tensor) else type(features).__name__
            raise KdcollapseError(f"features must have shape (B, {self.feature_dim}), got {shape}")
        if not features.is_floating_point() or not bool(torch.isfinite(features).all()):
            raise KdcollapseError("features must be finite floating-point values")
        x = features.detach().to(self.total.device, torch.float64)
        self.total += x.sum(0)
        self.count += x.shape[0]

    def compute(self) -> Tensor:
        if int(self.count) == 0:
            raise KdcollapseError("FeatureMean holds no samples: call update(features) first")
        return self.total / self.count
