"""ImageNet ResNets (He et al., CVPR 2016, Table 1): 7×7 stride-2 stem + max-pool, four stages of
64-128-256-512 channels; the layout of torchvision's ``resnet18/34/50``."""

from __future__ import annotations

from kdcollapse.models import register_model
from kdcollapse.models._resnet import BasicBlock, Bottleneck, ResNet, imagenet_stem

WIDTHS = [64, 128, 256, 512]


@register_model("resnet18", input_size=64, final_resolution=2, min_stages=4)
def resnet18(num_classes: int, in_channels: int = 3) -> ResNet:
    return ResNet(BasicBlock, [2, 2, 2, 2], WIDTHS, imagenet_stem(in_channels), 64, num_classes, 4)


@register_model("resnet34", input_size=64, final_resolution=2, min_stages=4)
def resnet34(num_classes: int, in_channels: int = 3) -> ResNet:
    return ResNet(BasicBlock, [3, 4, 6, 3], WIDTHS, imagenet_stem(in_channels), 64, num_classes, 4)


@register_model("resnet50", input_size=64, final_resolution=2, min_stages=4)
def resnet50(num_classes: int, in_channels: int = 3) -> ResNet:
    return ResNet(Bottleneck, [3, 4, 6, 3], WIDTHS, imagenet_stem(in_channels), 64, num_classes, 4)
