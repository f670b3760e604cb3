"""Residual networks (He et al., "Deep Residual Learning for Image Recognition", CVPR 2016).

One :class:`ResNet` serves the CIFAR zoo (3×3 stem, no max-pool) and the ImageNet models (7×7 stride-2
stem and max-pool): only the stem differs.
"""

from __future__ import annotations

import torch
from torch import nn

from kdcollapse.models._layers import ConvClassifier, conv_bn


class Residual(nn.Module):
    """``relu(branch(x) + shortcut(x))``; the shortcut is a strided 1×1 conv + BN when the shape changes
    (option B of He et al.), the identity otherwise."""

    expansion: int

    def __init__(self, branch: nn.Module, in_planes: int, out_planes: int, stride: int):
        super().__init__()
        self.branch = branch
        if stride != 1 or in_planes != out_planes:
            self.shortcut: nn.Module = conv_bn(in_planes, out_planes, 1, stride, act=False)
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.branch(x) + self.shortcut(x))

    def forward_pre_act(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(branch + shortcut, its ReLU): the pre-activation output OFD reads."""
        pre = self.branch(x) + self.shortcut(x)
        return pre, torch.relu(pre)


class BasicBlock(Residual):
    """Two 3×3 convolutions; the first carries the stride."""

    expansion = 1

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        branch = nn.Sequential(conv_bn(in_planes, planes, 3, stride), conv_bn(planes, planes, 3, act=False))
        super().__init__(branch, in_planes, planes, stride)


class Bottleneck(Residual):
    """1×1 reduce, 3×3 (carries the stride, as in torchvision's ResNet v1.5), 1×1 expand ×4."""

    expansion = 4

    def __init__(self, in_planes: int, planes: int, stride: int = 1):
        out_planes = planes * self.expansion
        branch = nn.Sequential(
            conv_bn(in_planes, planes, 1),
            conv_bn(planes, planes, 3, stride),
            conv_bn(planes, out_planes, 1, act=False),
        )
        super().__init__(branch, in_planes, out_planes, stride)


class ResNet(ConvClassifier):
    """``stem`` then one stage per entry of ``widths``, each of ``depths[i]`` blocks; every stage after
    the first halves the resolution. The feature is the globally pooled last stage,
    ``widths[-1] * block.expansion`` wide. ``feature_info``: the stem (reduction ``stem_reduction``: 1 for
    the CIFAR stem, 4 for the ImageNet stem with its max-pool) and the last block of every stage.
    """

    def __init__(
        self,
        block: type[BasicBlock] | type[Bottleneck],
        depths: list[int],
        widths: list[int],
        stem: nn.Sequential,
        stem_width: int,
        num_classes: int,
        stem_reduction: int = 1,
    ):
        layers: list[nn.Module] = [stem]
        stages = [(0, stem_width, stem_reduction)]
        in_planes = stem_width
        for i, (depth, width) in enumerate(zip(depths, widths)):
            for j in range(depth):
                layers.append(block(in_planes, width, 2 if i > 0 and j == 0 else 1))
                in_planes = width * block.expansion
            stages.append((len(layers) - 1, in_planes, stem_reduction * 2 ** i))
        super().__init__(nn.Sequential(*layers), in_planes, num_classes, stages)


def cifar_stem(in_channels: int, width: int) -> nn.Sequential:
    """3×3 stride-1 conv-BN-ReLU: keeps the 32×32 resolution of CIFAR images."""
    return conv_bn(in_channels, width, 3)


def imagenet_stem(in_channels: int, width: int = 64) -> nn.Sequential:
    """7×7 stride-2 conv-BN-ReLU and a 3×3 stride-2 max-pool: 224×224 -> 56×56."""
    return nn.Sequential(*conv_bn(in_channels, width, 7, 2), nn.MaxPool2d(3, 2, 1))
