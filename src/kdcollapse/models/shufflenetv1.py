"""ShuffleNet (V1; Zhang et al., CVPR 2018) in the CIFAR layout of the KD zoo (``ShuffleV1``).

A 1×1 stem of 24 channels and three stages of 4-8-4 units with groups g = 3 and 240-480-960 output
channels; the first unit of each stage has stride 2 and concatenates an average-pooled shortcut, the
others add an identity shortcut. The feature is the pooled 960-channel map.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.models import register_model
from kdcollapse.models._layers import ChannelShuffle, ConvClassifier, conv_bn

STEM = 24


class ShuffleUnit(nn.Module):
    """1×1 group conv (ReLU) -> channel shuffle -> 3×3 depthwise (ReLU, as in the zoo) -> 1×1 group conv;
    stride 2: ``relu(cat(branch, avgpool3x3(x)))``, stride 1: ``relu(branch + x)``. The branch width is
    a quarter of its output; ``first_groups`` is 1 for the first unit, whose 24-channel input is too
    narrow to split into groups."""

    def __init__(self, in_planes: int, out_planes: int, stride: int, groups: int, first_groups: int):
        super().__init__()
        branch_out = out_planes - in_planes if stride == 2 else out_planes
        mid = branch_out // 4
        self.branch = nn.Sequential(
            conv_bn(in_planes, mid, 1, groups=first_groups),
            ChannelShuffle(first_groups),
            conv_bn(mid, mid, 3, stride, groups=mid),
            conv_bn(mid, branch_out, 1, groups=groups, act=False),
        )
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.branch(x)
        if self.stride == 2:
            return torch.relu(torch.cat([out, F.avg_pool2d(x, 3, 2, 1)], 1))
        return torch.relu(out + x)

    def forward_pre_act(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        out = self.branch(x)
        pre = torch.cat([out, F.avg_pool2d(x, 3, 2, 1)], 1) if self.stride == 2 else out + x
        return pre, torch.relu(pre)


class ShuffleNetV1(ConvClassifier):
    def __init__(
        self,
        num_classes: int,
        in_channels: int = 3,
        out_planes: tuple[int, ...] = (240, 480, 960),
        num_blocks: tuple[int, ...] = (4, 8, 4),
        groups: int = 3,
    ):
        layers: list[nn.Module] = [conv_bn(in_channels, STEM, 1)]
        stages = [(0, STEM, 1)]
        in_planes = STEM
        for i, (width, n) in enumerate(zip(out_planes, num_blocks)):
            for j in range(n):
                first_groups = 1 if in_planes == STEM else groups
                layers.append(ShuffleUnit(in_planes, width, 2 if j == 0 else 1, groups, first_groups))
                in_planes = width
            stages.append((len(layers) - 1, width, 2 ** (i + 1)))
        super().__init__(nn.Sequential(*layers), in_planes, num_classes, stages)


@register_model("shufflev1", input_size=32, final_resolution=4, min_stages=4)
def shufflev1(num_classes: int, in_channels: int = 3) -> ShuffleNetV1:
    return ShuffleNetV1(num_classes, in_channels)
