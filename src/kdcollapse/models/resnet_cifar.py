"""CIFAR ResNets of the KD benchmarks (CRD, Tian et al. ICLR 2020; reused by DKD, DHKD, DKL).

``resnet{6n+2}``: a 3×3 stem of 16 channels and three stages of ``n`` BasicBlocks with 16-32-64 channels
(He et al. 2016, §4.2); the ``x4`` variants have a 32-channel stem and 64-128-256 stages.
``resnet50_cifar`` is the ImageNet ResNet-50 layout (Bottleneck, 3-4-6-3 blocks, 64-128-256-512) behind a
3×3 stride-1 stem, the CIFAR-100 teacher of the same zoo.
"""

from __future__ import annotations

from kdcollapse.errors import KdcollapseError
from kdcollapse.models import register_model
from kdcollapse.models._resnet import BasicBlock, Bottleneck, ResNet, cifar_stem

PLAIN = (16, 16, 32, 64)  # stem, stage 1, stage 2, stage 3 channels
X4 = (32, 64, 128, 256)


def cifar_resnet(depth: int, filters: tuple[int, ...], num_classes: int, in_channels: int = 3) -> ResNet:
    """ResNet-``depth`` (depth = 6n + 2: stem + 3 stages × n blocks × 2 convs) with ``filters`` =
    (stem, stage widths...)."""
    if depth < 8 or (depth - 2) % 6:
        raise KdcollapseError(f"CIFAR ResNet depth must be 6n+2 with n >= 1, got {depth}")
    n = (depth - 2) // 6
    stem, *widths = filters
    return ResNet(BasicBlock, [n] * len(widths), widths, cifar_stem(in_channels, stem), stem, num_classes)


@register_model("resnet8", input_size=32, final_resolution=8, min_stages=4)
def resnet8(num_classes: int, in_channels: int = 3) -> ResNet:
    return cifar_resnet(8, PLAIN, num_classes, in_channels)


@register_model("resnet14", input_size=32, final_resolution=8, min_stages=4)
def resnet14(num_classes: int, in_channels: int = 3) -> ResNet:
    return cifar_resnet(14, PLAIN, num_classes, in_channels)


@register_model("resnet20", input_size=32, final_resolution=8, min_stages=4)
def resnet20(num_classes: int, in_channels: int = 3) -> ResNet:
    return cifar_resnet(20, PLAIN, num_classes, in_channels)


@register_model("resnet32", input_size=32, final_resolution=8, min_stages=4)
def resnet32(num_classes: int, in_channels: int = 3) -> ResNet:
    return cifar_resnet(32, PLAIN, num_classes, in_channels)


@register_model("resnet44", input_size=32, final_resolution=8, min_stages=4)
def resnet44(num_classes: int, in_channels: int = 3) -> ResNet:
    return cifar_resnet(44, PLAIN, num_classes, in_channels)


@register_model("resnet56", input_size=32, final_resolution=8, min_stages=4)
def resnet56(num_classes: int, in_channels: int = 3) -> ResNet:
    return cifar_resnet(56, PLAIN, num_classes, in_channels)


@register_model("resnet110", input_size=32, final_resolution=8, min_stages=4)
def resnet110(num_classes: int, in_channels: int = 3) -> ResNet:
    return cifar_resnet(110, PLAIN, num_classes, in_channels)


@register_model("resnet8x4", input_size=32, final_resolution=8, min_stages=4)
def resnet8x4(num_classes: int, in_channels: int = 3) -> ResNet:
    return cifar_resnet(8, X4, num_classes, in_channels)


@register_model("resnet32x4", input_size=32, final_resolution=8, min_stages=4)
def resnet32x4(num_classes: int, in_channels: int = 3) -> ResNet:
    return cifar_resnet(32, X4, num_classes, in_channels)


@register_model("resnet50_cifar", input_size=32, final_resolution=4, min_stages=4)
def resnet50_cifar(num_classes: int, in_channels: int = 3) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], [64, 128, 256, 512], cifar_stem(in_channels, 64), 64, num_classes)
