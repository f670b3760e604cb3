"""The trainable parts of the feature methods (ReviewKD's ABF chain) against the official code.

``OfficialABF`` and ``official_review_forward`` transcribe megvii-research/mdistiller at commit
a08d46f10d6102bd6e3f258ca5ac880b020ea259, ``mdistiller/distillers/ReviewKD.py`` (class ABF and the
fusion loop of ReviewKD.forward_train), which equal dvlab-research/ReviewKD ``CIFAR-100/model/reviewkd.py``
at cede6ea6387ae9b6127de0e561507177bf19c11e. The same weights are copied into both; values and gradients
are compared in float64, in train mode (batch statistics) and eval mode.
"""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.methods.reviewkd import ReviewFusion


class OfficialABF(nn.Module):
    def __init__(self, in_channel, mid_channel, out_channel, fuse):
        super().__init__()
        self.conv1 = nn.Sequential(nn.Conv2d(in_channel, mid_channel, kernel_size=1, bias=False),
                                   nn.BatchNorm2d(mid_channel))
        self.conv2 = nn.Sequential(nn.Conv2d(mid_channel, out_channel, kernel_size=3, stride=1, padding=1,
                                             bias=False), nn.BatchNorm2d(out_channel))
        self.att_conv = nn.Sequential(nn.Conv2d(mid_channel * 2, 2, kernel_size=1), nn.Sigmoid()) if fuse else None

    def forward(self, x, y=None, shape=None, out_shape=None):
        n, _, h, w = x.shape
        x = self.conv1(x)
        if self.att_conv is not None:
            y = F.interpolate(y, (shape, shape), mode="nearest")
            z = torch.cat([x, y], dim=1)
            z = self.att_conv(z)
            x = x * z[:, 0].view(n, 1, h, w) + y * z[:, 1].view(n, 1, h, w)
        if x.shape[-1] != out_shape:
            x = F.interpolate(x, (out_shape, out_shape), mode="nearest")
        y = self.conv2(x)
        return y, x


def official_abfs(in_channels, out_channels):
    abfs = nn.ModuleList()
    mid_channel = min(512, in_channels[-1])
    for idx, in_channel in enumerate(in_channels):
        abfs.append(OfficialABF(in_channel, mid_channel, out_channels[idx], idx < len(in_channels) - 1))
    return abfs[::-1]


def official_review_forward(abfs, shapes, out_shapes, feats, pooled):
    x = feats + [pooled.unsqueeze(-1).unsqueeze(-1)]
    x = x[::-1]
    results = []
    out_features, res_features = abfs[0](x[0], out_shape=out_shapes[0])
    results.append(out_features)
    for features, abf, shape, out_shape in zip(x[1:], abfs[1:], shapes[1:], out_shapes[1:]):
        out_features, res_features = abf(features, res_features, shape, out_shape)
        results.insert(0, out_features)
    return results


@pytest.mark.parametrize("train", [True, False])
@pytest.mark.parametrize("case", ["same_size", "student_smaller"])
def test_review_fusion_matches_official(train, case):
    # resnet8x4-like student (16x16, 8x8, 4x4 maps at width/4) against teacher maps of equal size, and a
    # ShuffleNet-like student whose maps are half the teacher's (the official out_shapes case).
    in_channels, out_channels = [4, 6, 8, 8], [5, 7, 9, 9]
    student_sizes = [8, 4, 2] if case == "same_size" else [4, 2, 1]
    teacher_sizes = [8, 4, 2]
    shapes = [1] + student_sizes[::-1]  # official SHAPES / OUT_SHAPES: deepest (pooled) first
    out_shapes = [1] + teacher_sizes[::-1]
    torch.manual_seed(0)
    ours = ReviewFusion(in_channels, out_channels).double()
    official = official_abfs(in_channels, out_channels).double()
    for mine, theirs in zip(ours.blocks, official):
        theirs.load_state_dict(mine.state_dict())
        for m in theirs.modules():  # non-trivial BN affine parameters and running statistics
            if isinstance(m, nn.BatchNorm2d):
                nn.init.uniform_(m.weight, 0.5, 1.5)
                nn.init.normal_(m.bias)
                m.running_mean.normal_()
        mine.load_state_dict(theirs.state_dict())
    ours.train(train), official.train(train)
    feats = [torch.randn(3, c, s, s, dtype=torch.float64, requires_grad=True)
             for c, s in zip(in_channels[:-1], student_sizes)]
    pooled = torch.randn(3, in_channels[-1], dtype=torch.float64, requires_grad=True)
    expected = official_review_forward(official, shapes, out_shapes, feats, pooled)
    got = ours([*feats, pooled[:, :, None, None]], [*teacher_sizes, 1])
    assert [tuple(g.shape) for g in got] == [(3, c, s, s) for c, s in zip(out_channels, [*teacher_sizes, 1])]
    weights = [torch.randn_like(e) for e in expected]
    loss_ours = sum((g * w).sum() for g, w in zip(got, weights))
    loss_official = sum((e * w).sum() for e, w in zip(expected, weights))
    torch.testing.assert_close(loss_ours, loss_official, rtol=1e-12, atol=1e-12)
    inputs = [*feats, pooled]
    grads_ours = torch.autograd.grad(loss_ours, inputs + list(ours.parameters()))
    grads_official = torch.autograd.grad(loss_official, inputs + list(official.parameters()))
    for a, b in zip(grads_ours, grads_official):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
