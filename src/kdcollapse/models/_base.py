"""The seams every model exposes: penultimate features and a separate head, and the stage outputs as maps
(``forward_intermediates`` / ``feature_info``, timm's names)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from kdcollapse.errors import KdcollapseError


@dataclass(frozen=True)
class FeatureInfo:
    """One stage output a model offers to :meth:`Classifier.forward_intermediates`.

    ``stage``: its index in ``feature_info`` (0 is the stem where the family has one); ``channels``: C of its
    (B, C, H, W) map; ``reduction``: the input's height over the map's (the cumulative stride); ``module``:
    the path of the layer whose output it is (``model.get_submodule(module)``)."""

    stage: int
    channels: int
    reduction: int
    module: str


Indices = int | Sequence[int] | None


def stage_indices(feature_info: Sequence[FeatureInfo], indices: Indices) -> list[int]:
    """timm's ``indices``: ``None`` every stage, an int ``n`` the last ``n`` stages, a sequence the stages
    named (negative counts from the end). Raises a ``KdcollapseError`` naming the valid range."""
    n = len(feature_info)
    if indices is None:
        return list(range(n))
    if isinstance(indices, int):
        if not 0 <= indices <= n:
            raise KdcollapseError(f"indices={indices}: this model has {n} stages; give 0..{n} (the last n stages)")
        return list(range(n - indices, n))
    chosen = []
    for i in indices:
        if not -n <= i < n:
            raise KdcollapseError(f"stage {i} does not exist: this model has {n} stages (indices 0..{n - 1} or "
                                  f"-{n}..-1; see model.feature_info)")
        chosen.append(i % n)
    return chosen


class Classifier(nn.Module):
    """A backbone producing a (B, d) feature and a linear head producing logits.

    Subclasses build their layers, call ``self._init_head(feature_dim, num_classes)`` and implement
    :meth:`forward_features`. Distillation methods, dual heads and collapse metrics all tap the feature
    returned by ``forward_features`` (after global pooling, before the classifier). Feature-map methods
    (FitNet, AT, OFD, ...) read the stage outputs of :meth:`forward_intermediates`, described by
    ``feature_info``.
    """

    feature_dim: int
    num_classes: int
    head: nn.Module
    feature_info: list[FeatureInfo] = []

    def _init_head(self, feature_dim: int, num_classes: int) -> None:
        self.feature_dim = feature_dim
        self.reset_classifier(num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_head(self, h: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return h if pre_logits else self.head(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(self, x: torch.Tensor, indices: Indices = None, *,
                              pre_act: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """``(h, maps)``: the (B, d) penultimate feature (what :meth:`forward_features` returns) and the
        (B, C, H, W) outputs of the stages ``indices`` (see :func:`stage_indices`) in that order, from one
        forward pass. ``pre_act``: each stage output before its last ReLU (OFD's features), where the stage
        ends with one; a stage ending linearly returns its output either way."""
        if self.feature_info:
            raise NotImplementedError(f"{type(self).__name__} declares feature_info but not forward_intermediates")
        if indices not in (None, 0) and len(indices):
            raise KdcollapseError(f"{type(self).__name__} has no stage outputs (feature_info is empty)")
        return self.forward_features(x), []

    def reset_classifier(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.head = nn.Linear(self.feature_dim, num_classes)


@contextlib.contextmanager
def evaluating(modules: Iterable[nn.Module]) -> Iterator[None]:
    """Eval mode and no gradients inside; every module's previous mode is restored afterwards."""
    modules = list(modules)
    modes = [m.training for m in modules]
    try:
        for m in modules:
            m.eval()
        with torch.no_grad():
            yield
    finally:
        for m, mode in zip(modules, modes):
            m.train(mode)
