"""VGG with batch normalisation (Simonyan & Zisserman, ICLR 2015), the CIFAR layout of the KD zoo.

Five stages of 3×3 conv-BN-ReLU (convolutions with bias, as in the zoo), 2×2 max-pools between them,
global average pooling and one linear layer on the 512-d feature (no fully connected hidden layers).
``vgg8`` is the zoo's one-conv-per-stage configuration "S"; ``vgg11/13/16/19`` are configurations A/B/D/E.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.models import register_model
from kdcollapse.models._layers import ConvClassifier, conv_bn

# Channels of the convolutions of each of the five stages.
CONFIGS = {
    "vgg8": [[64], [128], [256], [512], [512]],
    "vgg11": [[64], [128], [256, 256], [512, 512], [512, 512]],
    "vgg13": [[64, 64], [128, 128], [256, 256], [512, 512], [512, 512]],
    "vgg16": [[64, 64], [128, 128], [256] * 3, [512] * 3, [512] * 3],
    "vgg19": [[64, 64], [128, 128], [256] * 4, [512] * 4, [512] * 4],
}


class PoolIfLarge(nn.Module):
    """2×2 max-pool, skipped for maps smaller than 8×8: 32×32 CIFAR inputs reach the last stage at 4×4
    (as in the zoo, which pools there only for 64×64 inputs), larger inputs are pooled once more."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(x, 2) if min(x.shape[-2:]) >= 8 else x


class VGG(ConvClassifier):
    def __init__(self, stages: list[list[int]], num_classes: int, in_channels: int = 3):
        layers: list[nn.Module] = []
        ends = []  # the last conv of each stage, before the pool; the last stage's reduction is that of 32×32
        for i, stage in enumerate(stages):  # inputs (16 from 64×64 on, where its pool applies)
            if i > 0:  # a 2×2 max-pool between stages; the last one only on maps of 8×8 and larger
                layers.append(PoolIfLarge() if i == len(stages) - 1 else nn.MaxPool2d(2))
            for width in stage:
                layers.append(conv_bn(in_channels, width, 3, bias=True))
                in_channels = width
            ends.append((len(layers) - 1, in_channels, 2 ** min(i, len(stages) - 2)))
        super().__init__(nn.Sequential(*layers), in_channels, num_classes, ends)


@register_model("vgg8", input_size=32, final_resolution=4, min_stages=4)
def vgg8(num_classes: int, in_channels: int = 3) -> VGG:
    return VGG(CONFIGS["vgg8"], num_classes, in_channels)


@register_model("vgg11", input_size=32, final_resolution=4, min_stages=4)
def vgg11(num_classes: int, in_channels: int = 3) -> VGG:
    return VGG(CONFIGS["vgg11"], num_classes, in_channels)


@register_model("vgg13", input_size=32, final_resolution=4, min_stages=4)
def vgg13(num_classes: int, in_channels: int = 3) -> VGG:
    return VGG(CONFIGS["vgg13"], num_classes, in_channels)


@register_model("vgg16", input_size=32, final_resolution=4, min_stages=4)
def vgg16(num_classes: int, in_channels: int = 3) -> VGG:
    return VGG(CONFIGS["vgg16"], num_classes, in_channels)


@register_model("vgg19", input_size=32, final_resolution=4, min_stages=4)
def vgg19(num_classes: int, in_channels: int = 3) -> VGG:
    return VGG(CONFIGS["vgg19"], num_classes, in_channels)
