"""The seam every model exposes: penultimate features and a separate head."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn


class Classifier(nn.Module):
    """A backbone producing a (B, d) feature and a linear head producing logits.

    Subclasses build their layers, call ``self._init_head(feature_dim, num_classes)`` and implement
    :meth:`forward_features`. Distillation methods, dual heads and collapse metrics all tap the feature
    returned by ``forward_features`` (after global pooling, before the classifier).
    """

    feature_dim: int
    num_classes: int
    head: nn.Module

    def _init_head(self, feature_dim: int, num_classes: int) -> None:
        self.feature_dim = feature_dim
        self.reset_classifier(num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward_head(self, h: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return h if pre_logits else self.head(h)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

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
