"""Building blocks shared by the model families: conv-BN-ReLU, channel shuffle, pooled classifiers."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.models._base import Classifier, FeatureInfo, Indices, stage_indices


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


def forward_pre_act(module: nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(pre, out)``: ``module``'s output ``out`` and the same before its last ReLU (``pre``).

    A block defines ``forward_pre_act`` itself when its ReLU follows a sum or a concatenation (residual and
    shuffle units); an ``nn.Sequential`` runs all but its last layer and recurses into that one; a ReLU is
    applied out of place so that ``pre`` survives; any other layer ends linearly: ``pre`` is ``out``."""
    if hasattr(module, "forward_pre_act"):
        return module.forward_pre_act(x)
    if isinstance(module, nn.Sequential) and len(module):
        for layer in list(module)[:-1]:
            x = layer(x)
        return forward_pre_act(module[-1], x)
    if isinstance(module, nn.ReLU):
        return x, torch.relu(x)
    out = module(x)
    return out, out


class ConvClassifier(Classifier):
    """A convolutional ``body`` whose output map is globally average-pooled into the (B, d) feature.

    Adaptive pooling makes every subclass work at any input resolution large enough for its strides.
    ``stages``: where the family's stages end, one ``(body index, channels, reduction)`` per stage, the
    stem first where there is one; they become ``feature_info`` (module ``body.<index>``) and the maps of
    :meth:`forward_intermediates`.
    """

    def __init__(self, body: nn.Sequential, feature_dim: int, num_classes: int,
                 stages: Sequence[tuple[int, int, int]] = ()):
        super().__init__()
        self.body = body
        init_weights(self)
        self._init_head(feature_dim, num_classes)
        self.feature_info = [FeatureInfo(i, channels, reduction, f"body.{index % len(body)}")
                             for i, (index, channels, reduction) in enumerate(stages)]
        self._stage_ends = [index % len(body) for index, _, _ in stages]

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        return self.pool(self.body(x))

    @staticmethod
    def pool(x: torch.Tensor) -> torch.Tensor:
        return torch.flatten(F.adaptive_avg_pool2d(x, 1), 1)

    def forward_intermediates(self, x: torch.Tensor, indices: Indices = None, *,
                              pre_act: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        wanted = stage_indices(self.feature_info, indices)
        ends = {self._stage_ends[i]: i for i in wanted}
        maps: dict[int, torch.Tensor] = {}
        for j, layer in enumerate(self.body):
            if j in ends and pre_act:
                maps[ends[j]], x = forward_pre_act(layer, x)
            else:
                x = layer(x)
                if j in ends:
                    maps[ends[j]] = x
        return self.pool(x), [maps[i] for i in wanted]
