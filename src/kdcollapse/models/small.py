"""Small networks for 28×28 grey images (Fashion-MNIST, MNIST): an MLP and two plain CNNs.

``convnet`` is a teacher: four 3×3 conv-BN-ReLU layers of 32-64-128-256 channels, each of the first
three followed by a 2×2 max-pool (0.39M parameters, 10M multiply-adds per 28×28 image, so that it
trains in minutes per epoch on one CPU core). ``convnet_small`` is the same layout at half the width (16-32-64-128), a
student with 0.10M parameters and 2.6M multiply-adds. Both pool globally, so 32×32 inputs work too.
"""

from __future__ import annotations

import torch
from torch import nn

from kdcollapse.errors import KdcollapseError
from kdcollapse.models import register_model
from kdcollapse.models._base import Classifier
from kdcollapse.models._layers import ConvClassifier, conv_bn


class MLP(Classifier):
    """Flatten, then Linear-ReLU layers of widths ``hidden``; the feature is the last hidden layer, or, with
    ``bottleneck``, the output of one more Linear layer of that width without activation (the linear layer
    the GNC paper inserts before the classifier to set the feature dimension d, App. B.3), so that features
    can point in every direction (ReLU features lie in the positive orthant)."""

    def __init__(
        self, num_classes: int, in_features: int, hidden: tuple[int, ...] = (512, 256), bottleneck: int | None = None
    ):
        super().__init__()
        self.in_features = in_features
        layers: list[nn.Module] = []
        for width in hidden:
            layers += [nn.Linear(in_features, width), nn.ReLU(inplace=True)]
            in_features = width
        if bottleneck is not None:
            if bottleneck < 1:
                raise KdcollapseError(f"bottleneck must be a positive width, got {bottleneck}")
            layers.append(nn.Linear(in_features, bottleneck))
            in_features = bottleneck
        self.body = nn.Sequential(*layers)
        self._init_head(in_features, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        if x.shape[1] != self.in_features:
            raise KdcollapseError(
                f"MLP expects inputs of {self.in_features} values per example, got {x.shape[1]}; "
                "build it with the matching input_size and in_channels"
            )
        return self.body(x)


class ConvNet(ConvClassifier):
    """3×3 conv-BN-ReLU layers of the given widths; a 2×2 max-pool follows each layer whose index is in
    ``pool_after``."""

    def __init__(
        self, widths: tuple[int, ...], pool_after: tuple[int, ...], num_classes: int, in_channels: int
    ):
        layers: list[nn.Module] = []
        stages, reduction = [], 1  # every conv layer, before its pool
        for i, width in enumerate(widths):
            layers.append(conv_bn(in_channels, width, 3))
            stages.append((len(layers) - 1, width, reduction))
            if i in pool_after:
                layers.append(nn.MaxPool2d(2))
                reduction *= 2
            in_channels = width
        super().__init__(nn.Sequential(*layers), in_channels, num_classes, stages)


@register_model("mlp", input_size=28, in_channels=1)
def mlp(
    num_classes: int,
    in_channels: int = 3,
    input_size: int | tuple[int, int] = 28,
    hidden: tuple[int, ...] = (512, 256),
    bottleneck: int | None = None,
) -> MLP:
    """MLP on ``in_channels × input_size × input_size`` inputs (``input_size=(H, W)`` for non-square ones,
    e.g. ``(28, 56)`` for ``fashion_mnist_pairs``), 784-512-256 for 28×28 grey images;
    ``bottleneck=d`` appends a linear d-dimensional feature layer (no activation)."""
    height, width = (input_size, input_size) if isinstance(input_size, int) else input_size
    given = {"input_size": input_size, "hidden": hidden, "bottleneck": bottleneck}
    sizes = {"input_size": (height, width), "hidden": tuple(hidden), "bottleneck": (bottleneck or 1,)}
    for key, values in sizes.items():
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in values):
            raise KdcollapseError(f"mlp: {key} must hold positive integers, got {given[key]!r}")
    return MLP(num_classes, in_channels * height * width, tuple(hidden), bottleneck)


@register_model("convnet_small", input_size=28, in_channels=1, final_resolution=3, min_stages=4)
def convnet_small(num_classes: int, in_channels: int = 3) -> ConvNet:
    return ConvNet((16, 32, 64, 128), (0, 1, 2), num_classes, in_channels)


@register_model("convnet", input_size=28, in_channels=1, final_resolution=3, min_stages=4)
def convnet(num_classes: int, in_channels: int = 3) -> ConvNet:
    return ConvNet((32, 64, 128, 256), (0, 1, 2), num_classes, in_channels)
