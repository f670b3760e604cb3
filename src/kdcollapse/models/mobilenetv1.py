"""MobileNetV1 (Howard et al., 2017, Table 1) as used for ImageNet students in the KD literature: a 3×3
stride-2 stem of 32 channels and 13 depthwise-separable blocks up to 1024 channels (width 1.0, 4.23M
parameters at 1000 classes)."""

from __future__ import annotations

from torch import nn

from kdcollapse.models import register_model
from kdcollapse.models._layers import ConvClassifier, conv_bn

# (output channels, stride) of the depthwise-separable blocks.
BLOCKS = [(64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), *[(512, 1)] * 5, (1024, 2), (1024, 1)]


def depthwise_separable(in_planes: int, out_planes: int, stride: int) -> nn.Sequential:
    """3×3 depthwise conv-BN-ReLU then 1×1 pointwise conv-BN-ReLU."""
    depthwise = conv_bn(in_planes, in_planes, 3, stride, groups=in_planes)
    return nn.Sequential(depthwise, conv_bn(in_planes, out_planes, 1))


class MobileNetV1(ConvClassifier):
    def __init__(self, num_classes: int, in_channels: int = 3):
        layers: list[nn.Module] = [conv_bn(in_channels, 32, 3, 2)]
        stages, reduction = [(0, 32, 2)], 2  # the stem and every block before a stride 2 (and the last)
        in_planes = 32
        for k, (out_planes, stride) in enumerate(BLOCKS):
            layers.append(depthwise_separable(in_planes, out_planes, stride))
            in_planes, reduction = out_planes, reduction * stride
            if k + 1 == len(BLOCKS) or BLOCKS[k + 1][1] == 2:
                stages.append((len(layers) - 1, out_planes, reduction))
        super().__init__(nn.Sequential(*layers), in_planes, num_classes, stages)


@register_model("mobilenetv1", input_size=64, final_resolution=2, min_stages=4)
def mobilenetv1(num_classes: int, in_channels: int = 3) -> MobileNetV1:
    return MobileNetV1(num_classes, in_channels)
