"""Model registry: ``create_model(name, num_classes, in_channels=3)`` and ``list_models(pattern)``.

Each model family lives in one module and registers its entry points with ``@register_model``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

from torch import nn

from kdcollapse._registry import Registry
from kdcollapse.errors import KdcollapseError
from kdcollapse.models._adapter import FeatureSpec, ModuleClassifier, adapt_state_dict, as_classifier
from kdcollapse.models._base import Classifier, FeatureInfo, evaluating
from kdcollapse.models._convert import classifier_shape, convert_state_dict, input_channels, unwrap_state_dict

_MODELS: Registry[Callable[..., Classifier]] = Registry("model")
register_model = _MODELS.register


def create_model(name: str, num_classes: int, in_channels: int = 3, **kwargs) -> Classifier:
    """Build a registered model; a factory returning a plain ``nn.Module`` is wrapped by
    :func:`as_classifier` (its feature found automatically). Raises a ``KdcollapseError`` listing the valid names for an unknown name
    and the valid options for an unknown keyword argument."""
    factory = _MODELS.get(name)
    params = inspect.signature(factory).parameters
    options = [p for p in params if p not in ("num_classes", "in_channels")]
    unknown = sorted(set(kwargs) - set(options))
    if unknown and not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        valid = ", ".join(options) if options else "none"
        raise KdcollapseError(f"model {name!r} has no option(s) {', '.join(unknown)}. Valid options: {valid}")
    if num_classes < 1 or in_channels < 1:
        raise KdcollapseError(
            f"num_classes and in_channels must be >= 1, got {num_classes} and {in_channels}"
        )
    model = factory(num_classes=num_classes, in_channels=in_channels, **kwargs)
    return as_classifier(model, num_classes=num_classes)


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered names matching a shell-style pattern, e.g. ``list_models("resnet*")``."""
    return _MODELS.names(pattern)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not) of ``model``; buffers such as BN statistics excluded."""
    return sum(p.numel() for p in model.parameters())


# Importing the family modules registers their models.
from kdcollapse.models import _families  # noqa: E402,F401

__all__ = [
    "Classifier", "FeatureInfo", "ModuleClassifier", "FeatureSpec", "as_classifier", "adapt_state_dict", "evaluating",
    "create_model", "list_models", "register_model", "count_parameters",
    "convert_state_dict", "unwrap_state_dict", "classifier_shape", "input_channels",
]
