"""ShuffleNetV2 (Ma et al., ECCV 2018) in the CIFAR layout of the KD zoo (``ShuffleV2``, net size 1).

A 1×1 stem of 24 channels, three stages (116-232-464 channels) of one down-sampling unit followed by
3-7-3 basic units, and a 1×1 conv to 1024 channels, which is the feature.
"""

from __future__ import annotations

import torch
from torch import nn

from kdcollapse.models import register_model
from kdcollapse.models._layers import ChannelShuffle, ConvClassifier, conv_bn, forward_pre_act

STEM = 24


def _dw_pw(in_planes: int, out_planes: int, stride: int) -> nn.Sequential:
    """3×3 depthwise conv-BN (no ReLU) then 1×1 conv-BN-ReLU."""
    return nn.Sequential(conv_bn(in_planes, in_planes, 3, stride, groups=in_planes, act=False),
                         conv_bn(in_planes, out_planes, 1))  # fmt: skip


class BasicUnit(nn.Module):
    """Split the channels in halves, transform one (1×1, depthwise 3×3, 1×1), concatenate, shuffle."""

    def __init__(self, channels: int):
        super().__init__()
        half = channels // 2
        self.branch = nn.Sequential(conv_bn(half, half, 1), _dw_pw(half, half, 1))
        self.shuffle = ChannelShuffle(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x1, x2 = x.chunk(2, dim=1)
        return self.shuffle(torch.cat([x1, self.branch(x2)], 1))

    def forward_pre_act(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The branch before its last ReLU, concatenated and shuffled like the output."""
        x1, x2 = x.chunk(2, dim=1)
        pre, out = forward_pre_act(self.branch, x2)
        return self.shuffle(torch.cat([x1, pre], 1)), self.shuffle(torch.cat([x1, out], 1))


class DownUnit(nn.Module):
    """Two stride-2 branches on the whole input, each giving half the output channels; concat, shuffle."""

    def __init__(self, in_planes: int, out_planes: int):
        super().__init__()
        mid = out_planes // 2
        self.left = _dw_pw(in_planes, mid, 2)
        self.right = nn.Sequential(conv_bn(in_planes, mid, 1), _dw_pw(mid, mid, 2))
        self.shuffle = ChannelShuffle(2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.shuffle(torch.cat([self.left(x), self.right(x)], 1))


class ShuffleNetV2(ConvClassifier):
    def __init__(
        self,
        num_classes: int,
        in_channels: int = 3,
        out_planes: tuple[int, ...] = (116, 232, 464, 1024),
        num_blocks: tuple[int, ...] = (3, 7, 3),
    ):
        layers: list[nn.Module] = [conv_bn(in_channels, STEM, 1)]
        stages = [(0, STEM, 1)]
        in_planes = STEM
        for i, (width, n) in enumerate(zip(out_planes, num_blocks)):
            layers.append(DownUnit(in_planes, width))
            layers.extend(BasicUnit(width) for _ in range(n))
            in_planes = width
            stages.append((len(layers) - 1, width, 2 ** (i + 1)))
        layers.append(conv_bn(in_planes, out_planes[-1], 1))
        super().__init__(nn.Sequential(*layers), out_planes[-1], num_classes, stages)


@register_model("shufflev2", input_size=32, final_resolution=4, min_stages=4)
def shufflev2(num_classes: int, in_channels: int = 3) -> ShuffleNetV2:
    return ShuffleNetV2(num_classes, in_channels)
