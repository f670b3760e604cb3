"""Model registry: ``create_model(name, num_classes, in_channels=3)`` and ``list_models(pattern)``.

Each model family lives in one module and registers its entry points with ``@register_model``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.parameter import UninitializedParameter

from kdcollapse._registry import Registry
from kdcollapse.errors import KdcollapseError
from kdcollapse.models._adapter import FeatureSpec, ModuleClassifier, adapt_state_dict, as_classifier
from kdcollapse.models._base import Classifier, FeatureInfo, evaluating, stage_indices
from kdcollapse.models._layers import ConvClassifier, conv_bn
from kdcollapse.models._convert import (MDISTILLER_TEACHERS, classifier_shape, convert_state_dict, input_channels,
                                       unwrap_state_dict)

@dataclass(frozen=True)
class ModelInfo:
    """A registered model: its factory ``f(num_classes, in_channels, **options)`` and what it promises, which
    the registry-driven model tests (tests/test_models.py, tests/test_feature_seam.py) check on every entry.

    ``input_size`` and ``in_channels``: the small input its tests run it at (the family's usual resolution:
    32 for the CIFAR zoo, 64 for the ImageNet nets, 28 for the small grey-image models).
    ``final_resolution``: the side of its last feature map (``body(x)``) at that input (``None``: not a
    spatial network, or not promised). ``min_stages``: how many ``feature_info`` stages it exposes at least;
    the feature methods' default stages (1, 2, 3) need 4 (stem and three stages), the zoo's CNNs declare
    that; :func:`create_model` refuses a model with fewer."""

    name: str
    factory: Callable[..., nn.Module]
    input_size: int = 32
    in_channels: int = 3
    final_resolution: int | None = None
    min_stages: int = 0


_MODELS: Registry[ModelInfo] = Registry("model")


def register_model(name: str | None = None, *, input_size: int = 32, in_channels: int = 3,
                   final_resolution: int | None = None,
                   min_stages: int = 0) -> Callable[[Callable[..., nn.Module]], Callable[..., nn.Module]]:
    """Decorator: register the factory under ``name`` (default: its ``__name__``) with what it promises
    (see :class:`ModelInfo`); the factory is returned unchanged."""
    def decorator(factory: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
        key = name or factory.__name__
        _MODELS.register(key)(ModelInfo(key, factory, input_size, in_channels, final_resolution, min_stages))
        return factory

    return decorator


def model_info(name: str) -> ModelInfo:
    """The registration of model ``name``; an unknown name lists the registered ones."""
    return _MODELS.get(name)


def create_model(name: str, num_classes: int, in_channels: int = 3, *, input_shape: tuple[int, ...] | None = None,
                 **kwargs) -> Classifier:
    """Build a registered model; a factory returning a plain ``nn.Module`` is wrapped by
    :func:`as_classifier` (its feature found automatically). Raises a ``KdcollapseError`` listing the valid names for an unknown name
    and the valid options for an unknown keyword argument. A model with lazy layers (``nn.LazyLinear``) is
    materialised by one forward pass of zeros of ``input_shape`` (one sample's shape, e.g. ``(1, 8, 8)``)."""
    info = _MODELS.get(name)
    factory = info.factory
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
    materialize(model, input_shape, name)
    model = as_classifier(model, num_classes=num_classes)
    if len(model.feature_info) < info.min_stages:
        raise KdcollapseError(f"model {name!r} is registered with min_stages={info.min_stages} but exposes "
                              f"{len(model.feature_info)} feature_info stages; give it its stages or register it "
                              f"with min_stages={len(model.feature_info)}")
    return model


def materialize(model: nn.Module, input_shape: tuple[int, ...] | None, name: str = "the model") -> None:
    """Give the lazy layers of ``model`` (``nn.LazyLinear``, ``nn.LazyConv2d``) their shapes with one forward
    pass of zeros (eval mode, no gradient; running statistics untouched); no-op without lazy layers."""
    if not any(isinstance(p, UninitializedParameter) for p in model.parameters()):
        return
    if not input_shape:
        raise KdcollapseError(f"model {name!r} has lazy layers (e.g. nn.LazyLinear), which need the input shape; "
                              "pass input_shape=(C, H, W) (the trainer passes the dataset's)")
    training = model.training
    try:
        with torch.no_grad():
            model.eval()(torch.zeros(2, *input_shape))
    except (RuntimeError, ValueError) as err:
        raise KdcollapseError(f"model {name!r} with lazy layers fails on inputs of shape {tuple(input_shape)}: "
                              f"{str(err).splitlines()[0]}") from None
    finally:
        model.train(training)


def list_models(pattern: str = "*") -> list[str]:
    """Sorted registered names matching a shell-style pattern, e.g. ``list_models("resnet*")``."""
    return _MODELS.names(pattern)


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (trainable or not) of ``model``; buffers such as BN statistics excluded."""
    return sum(p.numel() for p in model.parameters())


# Importing the family modules registers their models.
from kdcollapse.models import _families  # noqa: E402,F401

__all__ = [
    "Classifier", "ConvClassifier", "conv_bn", "FeatureInfo", "stage_indices", "ModuleClassifier", "FeatureSpec", "as_classifier", "adapt_state_dict", "evaluating",
    "create_model", "list_models", "register_model", "model_info", "ModelInfo", "count_parameters",
    "convert_state_dict", "unwrap_state_dict", "MDISTILLER_TEACHERS", "classifier_shape", "input_channels",
]
