"""MobileNetV2 (Sandler et al., CVPR 2018) in the CIFAR layout of the KD zoo.

The zoo's ``MobileNetV2`` student is width multiplier 0.5 with expansion t = 6: a 3×3 stride-2 stem,
seven stages of inverted residuals (the second stage keeps stride 1 for 32×32 inputs) and a 1×1 conv to
1280 channels, which is the feature. As in the zoo, every block has its 1×1 expansion conv, also when
t = 1.
"""

from __future__ import annotations

import torch
from torch import nn

from kdcollapse.models import register_model
from kdcollapse.models._layers import ConvClassifier, conv_bn

# (expansion, channels, blocks, stride) per stage; None = the network's expansion ratio.
STAGES = [(1, 16, 1, 1), (None, 24, 2, 1), (None, 32, 3, 2), (None, 64, 4, 2), (None, 96, 3, 1),
          (None, 160, 3, 2), (None, 320, 1, 1)]  # fmt: skip
FEATURE_STAGES = (1, 2, 4, 6)  # feature_info: the stem and the ends of these stages (the KD zoo's feats)


class InvertedResidual(nn.Module):
    """1×1 expand (ReLU) -> 3×3 depthwise (ReLU) -> 1×1 linear projection; identity shortcut when the
    stride is 1 and the width is unchanged."""

    def __init__(self, in_planes: int, out_planes: int, stride: int, expansion: int):
        super().__init__()
        hidden = in_planes * expansion
        self.branch = nn.Sequential(
            conv_bn(in_planes, hidden, 1),
            conv_bn(hidden, hidden, 3, stride, groups=hidden),
            conv_bn(hidden, out_planes, 1, act=False),
        )
        self.use_shortcut = stride == 1 and in_planes == out_planes

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.branch(x) if self.use_shortcut else self.branch(x)


class MobileNetV2(ConvClassifier):
    def __init__(self, num_classes: int, in_channels: int = 3, width_mult: float = 0.5, expansion: int = 6):
        in_planes = int(32 * width_mult)
        layers: list[nn.Module] = [conv_bn(in_channels, in_planes, 3, 2)]
        stages, reduction = [(0, in_planes, 2)], 2
        for k, (t, c, n, s) in enumerate(STAGES):
            out_planes = int(c * width_mult)
            reduction *= s
            for j in range(n):
                layers.append(InvertedResidual(in_planes, out_planes, s if j == 0 else 1, t or expansion))
                in_planes = out_planes
            if k in FEATURE_STAGES:
                stages.append((len(layers) - 1, out_planes, reduction))
        last = int(1280 * width_mult) if width_mult > 1.0 else 1280
        layers.append(conv_bn(in_planes, last, 1))
        super().__init__(nn.Sequential(*layers), last, num_classes, stages)


@register_model("mobilenetv2", input_size=32, final_resolution=2, min_stages=4)
def mobilenetv2(
    num_classes: int, in_channels: int = 3, width_mult: float = 0.5, expansion: int = 6
) -> MobileNetV2:
    """The KD zoo's MobileNetV2 student: width multiplier 0.5, expansion 6 by default."""
    return MobileNetV2(num_classes, in_channels, width_mult, expansion)
