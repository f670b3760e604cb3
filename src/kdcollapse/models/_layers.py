"""Building blocks shared by the model families: conv-BN-ReLU, channel shuffle, pooled classifiers."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.models._base import Classifier


def conv_bn(
    in_channels: int,
    out_channels: int,
    kernel_size: int,
    stride: int = 1,
    *,
    groups: int = 1,
    act: bool = True,
    bias: bool = False,
) -> nn.Sequential:
    """``Conv2d`` ('same' padding for odd kernels) -> ``BatchNorm2d`` -> ``ReLU`` (unless ``act=False``)."""
    layers = [
        nn.Conv2d(in_channels, out_channels, kernel_size, stride, kernel_size // 2, groups=groups, bias=bias),
        nn.BatchNorm2d(out_channels),
    ]
    if act:
        layers.append(nn.ReLU(inplace=True))
    return nn.Sequential(*layers)


class ChannelShuffle(nn.Module):
    """Interleave the channels of ``groups`` groups (ShuffleNet, Zhang et al. 2018): (B, g*c, H, W) ->
    view (B, g, c, H, W) -> transpose to (B, c, g, H, W) -> (B, g*c, H, W)."""

    def __init__(self, groups: int):
        super().__init__()
        self.groups = groups

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, c, h, w = x.shape
        return x.view(b, self.groups, c // self.groups, h, w).transpose(1, 2).reshape(b, c, h, w)

    def extra_repr(self) -> str:
        return f"groups={self.groups}"


def init_weights(module: nn.Module) -> None:
    """Kaiming-normal (fan-out, ReLU gain) convolutions with zero bias; BatchNorm weight 1, bias 0.

    Linear layers keep PyTorch's default initialisation.
    """
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.BatchNorm2d):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)


class ConvClassifier(Classifier):
    """A convolutional ``body`` whose output map is globally average-pooled into the (B, d) feature.

    Adaptive pooling makes every subclass work at any input resolution large enough for its strides.
    """

    def __init__(self, body: nn.Module, feature_dim: int, num_classes: int):
        super().__init__()
        self.body = body
        init_weights(self)
        self._init_head(feature_dim, num_classes)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(F.adaptive_avg_pool2d(self.body(x), 1), 1)
