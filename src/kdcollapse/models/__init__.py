"""Model registry: ``create_model(name, num_classes, in_channels=3)`` and ``list_models(pattern)``.

Each model family lives in one module and registers its entry points with ``@register_model``.
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from kdcollapse._registry import Registry
from kdcollapse.models._base import Classifier

_MODELS: Registry[Callable[..., Classifier]] = Registry("model")
register_model = _MODELS.register


def create_model(name: str, num_classes: int, in_channels: int = 3, **kwargs) -> Classifier:
    """Build a registered model. Raises a ``KdcollapseError`` listing valid names for an unknown one."""
    return _MODELS.get(name)(num_classes=num_classes, in_channels=in_channels, **kwargs)


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered names matching a shell-style pattern, e.g. ``list_models("resnet*")``."""
    return _MODELS.names(pattern)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


# Importing the family modules registers their models.
from kdcollapse.models import _families  # noqa: E402,F401

__all__ = ["Classifier", "create_model", "list_models", "register_model", "count_parameters"]
