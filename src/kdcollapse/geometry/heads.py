"""Classifier heads with unit-norm class vectors (GNC paper Sections 4 and 5).

Each head maps (B, d) features to (B, K) logits ``<h/||h||, w_k/||w_k||> / temperature`` -- the
spherical constraint of eq. 1-2 -- and can replace ``model.head`` of a
:class:`kdcollapse.models.Classifier`:

* :class:`CosineHead`: trainable class vectors (normalised in the forward pass);
* :class:`ClassMeanFeatureHead`: the CMF classifier of Section 5 / App. B.1, W an exponential moving
  average of the batch class means of the normalised features, never trained by gradients;
* :class:`FixedHead`: a fixed code (e.g. a softmax code) with a chosen class assignment (Section 4).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry._distances import unit_rows


class _SphericalHead(nn.Module):
    """Shared forward: cosine logits over the normalised ``weight`` (K, d), divided by the temperature."""

    weight: Tensor

    def __init__(self, in_features: int, num_classes: int, temperature: float):
        super().__init__()
        if in_features < 1 or num_classes < 2:
            raise KdcollapseError(f"need in_features >= 1 and num_classes >= 2, got {in_features}, {num_classes}")
        if not temperature > 0:
            raise KdcollapseError(f"temperature must be positive, got {temperature}")
        self.in_features, self.num_classes, self.temperature = in_features, num_classes, float(temperature)

    def forward(self, features: Tensor) -> Tensor:
        if features.ndim != 2 or features.shape[1] != self.in_features:
            raise KdcollapseError(
                f"{type(self).__name__} expects (B, {self.in_features}) features, got {tuple(features.shape)}"
            )
        return F.normalize(features, dim=1) @ F.normalize(self.weight, dim=1).T / self.temperature

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_classes={self.num_classes}, temperature={self.temperature}"


class CosineHead(_SphericalHead):
    """logits = <h/||h||, w_k/||w_k||> / temperature with trainable w_k (GNC eq. 1 under the constraint of eq. 2)."""

    def __init__(self, in_features: int, num_classes: int, temperature: float = 0.1):
        super().__init__(in_features, num_classes, temperature)
        self.weight = nn.Parameter(F.normalize(torch.randn(num_classes, in_features), dim=1))


class ClassMeanFeatureHead(_SphericalHead):
    """Class-mean-feature (CMF) classifier (GNC Section 5, App. B.1): W <- beta W + (1 - beta) Hbar_batch.

    ``weight`` is a buffer (saved in the state dict, no gradient, invisible to optimisers). The
    training method calls :meth:`update` with the batch's features and labels after the forward pass
    of each training step: for every class present in the batch, the row becomes
    normalise(beta * w_k + (1 - beta) * mean of the normalised features of class k); absent classes keep
    their row. Under ``torch.distributed`` the per-class sums and counts are all-reduced first, so every
    process applies the same update, equal to the one on the global batch.
    """

    def __init__(self, in_features: int, num_classes: int, beta: float = 0.9, temperature: float = 0.1):
        super().__init__(in_features, num_classes, temperature)
        if not 0 <= beta < 1:
            raise KdcollapseError(f"beta must be in [0, 1), got {beta}")
        self.beta = float(beta)
        self.register_buffer("weight", F.normalize(torch.randn(num_classes, in_features), dim=1))

    @torch.no_grad()
    def update(self, features: Tensor, labels: Tensor) -> None:
        """EMA step of W towards the batch class means of the normalised ``features`` (B, d) of ``labels`` (B,)."""
        if features.ndim != 2 or features.shape[1] != self.in_features or labels.shape != features.shape[:1]:
            raise KdcollapseError(
                f"update expects (B, {self.in_features}) features and (B,) labels, "
                f"got {tuple(features.shape)} and {tuple(labels.shape)}"
            )
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise KdcollapseError(f"labels must lie in [0, {self.num_classes}), got {labels.min()}..{labels.max()}")
        if not torch.isfinite(features).all():
            raise KdcollapseError("ClassMeanFeatureHead.update got NaN or infinite features")
        h = F.normalize(features.detach().to(self.weight.dtype), dim=1)
        sums = torch.zeros_like(self.weight).index_add_(0, labels, h)
        counts = torch.bincount(labels, minlength=self.num_classes).to(self.weight.dtype)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
            dist.all_reduce(counts)
        present = counts > 0
        means = sums[present] / counts[present, None]
        self.weight[present] = F.normalize(self.beta * self.weight[present] + (1 - self.beta) * means, dim=1)

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, beta={self.beta}"


class FixedHead(_SphericalHead):
    """A fixed classifier from a code W (K, d) and a class assignment (GNC Section 4).

    Class c uses code row ``assignment[c]`` (default: the identity), so ``weight = normalise(code)[assignment]``;
    logits are cosines divided by the temperature. ``weight`` is a buffer, never trained.
    """

    def __init__(self, code: Tensor, assignment: Tensor | list[int] | None = None, temperature: float = 0.1):
        code = unit_rows(code, "code")
        K, d = code.shape
        super().__init__(d, K, temperature)
        assignment = torch.arange(K) if assignment is None else torch.as_tensor(assignment)
        if assignment.shape != (K,) or not torch.equal(assignment.sort().values, torch.arange(K)):
            shown = assignment.tolist() if assignment.numel() <= 20 else f"a tensor of shape {tuple(assignment.shape)}"
            raise KdcollapseError(f"assignment must be a permutation of 0..{K - 1}, got {shown}")
        self.register_buffer("assignment", assignment.long())
        self.register_buffer("weight", code[assignment].float())
