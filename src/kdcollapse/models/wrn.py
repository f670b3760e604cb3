"""Wide residual networks WRN-d-k (Zagoruyko & Komodakis, BMVC 2016), the CIFAR layout of the KD zoo.

A 3×3 stem of 16 channels, three stages of n = (d - 4) / 6 pre-activation blocks with 16k-32k-64k
channels, then BN-ReLU and global pooling (feature dimension 64k).
"""

from __future__ import annotations

import torch
from torch import nn

from kdcollapse.errors import KdcollapseError
from kdcollapse.models import register_model
from kdcollapse.models._layers import ConvClassifier


def _bn_relu(channels: int) -> nn.Sequential:
    return nn.Sequential(nn.BatchNorm2d(channels), nn.ReLU(inplace=True))


class PreActBlock(nn.Module):
    """BN-ReLU-conv3×3-BN-ReLU-conv3×3 plus a shortcut; when the shape changes, the shortcut is a 1×1
    conv applied to the pre-activated input (He et al., "Identity Mappings in Deep Residual Networks")."""

    def __init__(self, in_planes: int, out_planes: int, stride: int = 1):
        super().__init__()
        self.preact = _bn_relu(in_planes)
        self.branch = nn.Sequential(
            nn.Conv2d(in_planes, out_planes, 3, stride, 1, bias=False),
            _bn_relu(out_planes),
            nn.Conv2d(out_planes, out_planes, 3, 1, 1, bias=False),
        )
        self.projection = None
        if stride != 1 or in_planes != out_planes:
            self.projection = nn.Conv2d(in_planes, out_planes, 1, stride, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.preact(x)
        return self.branch(a) + (x if self.projection is None else self.projection(a))


class WideResNet(ConvClassifier):
    def __init__(self, depth: int, widen_factor: int, num_classes: int, in_channels: int = 3):
        if depth < 10 or (depth - 4) % 6:
            raise KdcollapseError(f"WideResNet depth must be 6n+4 with n >= 1, got {depth}")
        n = (depth - 4) // 6
        layers: list[nn.Module] = [nn.Conv2d(in_channels, 16, 3, 1, 1, bias=False)]
        stages = [(0, 16, 1)]  # the stem conv and each stage's last block: sums before any BN-ReLU
        in_planes = 16
        for i, width in enumerate((16 * widen_factor, 32 * widen_factor, 64 * widen_factor)):
            for j in range(n):
                layers.append(PreActBlock(in_planes, width, 2 if i > 0 and j == 0 else 1))
                in_planes = width
            stages.append((len(layers) - 1, width, 2 ** i))
        layers.append(_bn_relu(in_planes))
        super().__init__(nn.Sequential(*layers), in_planes, num_classes, stages)


@register_model("wrn_16_1", input_size=32, final_resolution=8, min_stages=4)
def wrn_16_1(num_classes: int, in_channels: int = 3) -> WideResNet:
    return WideResNet(16, 1, num_classes, in_channels)


@register_model("wrn_16_2", input_size=32, final_resolution=8, min_stages=4)
def wrn_16_2(num_classes: int, in_channels: int = 3) -> WideResNet:
    return WideResNet(16, 2, num_classes, in_channels)


@register_model("wrn_40_1", input_size=32, final_resolution=8, min_stages=4)
def wrn_40_1(num_classes: int, in_channels: int = 3) -> WideResNet:
    return WideResNet(40, 1, num_classes, in_channels)


@register_model("wrn_40_2", input_size=32, final_resolution=8, min_stages=4)
def wrn_40_2(num_classes: int, in_channels: int = 3) -> WideResNet:
    return WideResNet(40, 2, num_classes, in_channels)


@register_model("wrn_34_10", input_size=32, final_resolution=8, min_stages=4)
def wrn_34_10(num_classes: int, in_channels: int = 3) -> WideResNet:
    """WRN-34-10, the model of the adversarial-robustness literature (TRADES, AWP, IKL-AT): 46.16M
    parameters at 10 classes."""
    return WideResNet(34, 10, num_classes, in_channels)
