"""Model zoo: the Classifier seam of every registered model, published parameter counts, errors."""

from __future__ import annotations

import functools

import pytest
import torch
from torch import nn

from kdcollapse.errors import KdcollapseError
from kdcollapse.models import Classifier, count_parameters, create_model, list_models, model_info, register_model
from kdcollapse.models._layers import ChannelShuffle
from kdcollapse.models.resnet_cifar import cifar_resnet
from kdcollapse.models.vgg import CONFIGS, PoolIfLarge

# The package's models (tests register others in scratch registries), by the test input their registrations
# declare: grey 28×28 (the small models), 64×64 (the ImageNet nets), else the CIFAR zoo at 32×32.
ZOO = [n for n in list_models() if model_info(n).factory.__module__.startswith("kdcollapse.models.")]
SMALL = {n for n in ZOO if model_info(n).in_channels == 1}
IMAGENET = {n for n in ZOO if n not in SMALL and model_info(n).input_size == 64}
CIFAR = set(ZOO) - SMALL - IMAGENET

# Published parameter counts in millions, CIFAR models at 100 classes, ImageNet models at 1000.
PUBLISHED = {
    # CRD CIFAR-100 zoo (Tian et al., ICLR 2020; the models of DKD, DHKD and DKL): the figures quoted for
    # the zoo in the KD literature.
    "resnet8": 0.08, "resnet20": 0.28, "resnet32": 0.47, "resnet44": 0.67, "resnet110": 1.74,
    "resnet8x4": 1.23, "resnet32x4": 7.43, "wrn_40_1": 0.57, "wrn_40_2": 2.25, "vgg8": 3.96,
    "vgg13": 9.46, "mobilenetv2": 0.81, "shufflev1": 0.95, "shufflev2": 1.36,
    # CIFAR-100 settings table of Heo et al., "A Comprehensive Overhaul of Feature Distillation"
    # (ICCV 2019): WRN 16-2 0.70M, ResNet 56 0.86M.
    "wrn_16_2": 0.70, "resnet56": 0.86,
    # WRN-34-10 of the adversarial-robustness literature: 46.16M at 10 classes (checked below), 46.22M at 100.
    "wrn_34_10": 46.22,
    # CIFAR-100 ResNet-50 23.71M: rentainhe/pytorch-models model_information/classic-network.md.
    "resnet50_cifar": 23.71,
    # torchvision model docs, num_params: 11,689,512 / 21,797,672 / 25,557,032.
    "resnet18": 11.69, "resnet34": 21.80, "resnet50": 25.56,
    # Howard et al. 2017, Table 8: 4.2M; 4.23M as quoted for the MobileNetV1 ImageNet student of the KD
    # literature (CRD / ReviewKD / DKD ImageNet tables).
    "mobilenetv1": 4.23,
    # No published figure: derived from the architecture, and checked exactly against the closed forms
    # below. The brief's 0.17M for resnet14 does not match the zoo's layout (181,108 parameters).
    "resnet14": 0.18, "wrn_16_1": 0.18, "vgg11": 9.28, "vgg16": 14.77, "vgg19": 20.09,
}  # fmt: skip


def _input_spec(name: str) -> tuple[int, int]:
    """(in_channels, resolution) of the small test input the model's registration declares."""
    info = model_info(name)
    return info.in_channels, info.input_size


def _num_classes(name: str) -> int:
    return 1000 if name in IMAGENET else 10 if name in SMALL else 100


@functools.cache
def _model(name: str) -> Classifier:
    """One shared instance per model (construction of the big nets dominates the test time)."""
    torch.manual_seed(0)
    return create_model(name, _num_classes(name), in_channels=_input_spec(name)[0])


def _first_layer(model: nn.Module) -> nn.Module:
    return next(m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear)))


def test_the_families_follow_from_the_registrations():
    assert {"resnet8", "wrn_40_2", "vgg13", "mobilenetv2", "shufflev2", "resnet50_cifar"} <= CIFAR
    assert IMAGENET == {"resnet18", "resnet34", "resnet50", "mobilenetv1"} and SMALL == {"mlp", "convnet_small", "convnet"}
    assert set(PUBLISHED) <= CIFAR | IMAGENET  # every published count names a zoo model


def test_every_zoo_cnn_declares_its_final_resolution_and_stages():
    for name in sorted(CIFAR | IMAGENET | {"convnet", "convnet_small"}):
        info = model_info(name)
        assert info.final_resolution and info.min_stages >= 4, name  # stem + the three stages feature methods read


def test_a_model_with_fewer_stages_than_declared_is_refused():
    from kdcollapse.models import _MODELS

    with _MODELS.scratch():
        register_model("_two_stages", min_stages=4)(lambda num_classes, in_channels=3: create_model(
            "mlp", num_classes, in_channels=in_channels, input_size=8))
        with pytest.raises(KdcollapseError) as err:
            create_model("_two_stages", 3, in_channels=1)
    assert "min_stages=4" in str(err.value) and "min_stages=0" in str(err.value)


def test_list_models_pattern():
    expected = {"resnet8", "resnet14", "resnet20", "resnet32", "resnet44", "resnet56", "resnet110",
                "resnet8x4", "resnet32x4", "resnet50_cifar", "resnet18", "resnet34", "resnet50"}  # fmt: skip
    names = list_models("resnet*")
    assert set(names) == expected
    # natural order: numbers compare as numbers
    assert names.index("resnet8") < names.index("resnet14") < names.index("resnet56") < names.index("resnet110")
    assert list_models("wrn_40_*") == ["wrn_40_1", "wrn_40_2"]
    assert list_models("nothing*") == []


@pytest.mark.parametrize("name", list_models())
def test_seam_forward_backward(name):
    model = _model(name)
    in_channels, size = _input_spec(name)
    x = torch.randn(2, in_channels, size, size)
    model.train()
    h = model.forward_features(x)
    assert h.shape == (2, model.feature_dim)
    logits = model.forward_head(h)
    assert logits.shape == (2, model.num_classes)
    assert torch.equal(model.forward_head(h, pre_logits=True), h)
    logits.square().mean().backward()
    grad = _first_layer(model).weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    model.zero_grad(set_to_none=True)
    model.eval()
    with torch.no_grad():
        assert torch.allclose(model(x), model.forward_head(model.forward_features(x)), atol=1e-6)
        side = model_info(name).final_resolution  # declared in its registration
        if side is not None:
            assert model.body(x).shape[-2:] == (side, side)


@pytest.mark.parametrize("name", list_models())
def test_grey_28x28_input(name):
    if name in SMALL:
        model = _model(name)
    else:
        model = create_model(name, 5, in_channels=1)
    size = 64 if name in IMAGENET else 28
    with torch.no_grad():
        out = model.eval()(torch.randn(2, 1, size, size))
    assert out.shape == (2, model.num_classes) and torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["convnet_small", "convnet"])
def test_small_convnets_accept_32x32(name):
    with torch.no_grad():
        assert _model(name).eval()(torch.randn(2, 1, 32, 32)).shape == (2, 10)


def test_mlp_input_size_and_error():
    assert create_model("mlp", 10, in_channels=1, input_size=32)(torch.randn(2, 1, 32, 32)).shape == (2, 10)
    with pytest.raises(KdcollapseError, match="784 values per example, got 1024"):
        _model("mlp")(torch.randn(2, 1, 32, 32))


def test_imagenet_models_at_224():
    with torch.no_grad():
        for name in ("resnet18", "mobilenetv1"):
            model = _model(name).eval()
            x = torch.randn(1, 3, 224, 224)
            assert model.body(x).shape[-2:] == (7, 7)
            assert model(x).shape == (1, 1000)


@pytest.mark.parametrize("name", list_models())
def test_reset_classifier(name):
    model = create_model(name, 3, in_channels=_input_spec(name)[0]) if name in SMALL else _model(name)
    head, num_classes = model.head, model.num_classes
    try:
        model.reset_classifier(17)
        assert model.head.weight.shape == (17, model.feature_dim)
        in_channels, size = _input_spec(name)
        with torch.no_grad():
            assert model.eval()(torch.randn(2, in_channels, size, size)).shape == (2, 17)
    finally:
        model.head, model.num_classes = head, num_classes


def _rounds_or_truncates_to(count: int, published: float) -> bool:
    """True if ``count`` parameters, in millions, give ``published`` when rounded or truncated to two
    decimals (published tables use both conventions)."""
    millions = count / 1e6
    return abs(millions - published) <= 0.005 or published <= millions < published + 0.01


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_published_parameter_count(name):
    count = count_parameters(_model(name))
    assert _rounds_or_truncates_to(count, PUBLISHED[name]), f"{name}: {count:,} vs {PUBLISHED[name]}M"


# --- exact counts against closed forms written from the papers' layer tables ---------------------------


def _conv(cin: int, cout: int, k: int = 3, bias: bool = False) -> int:
    return k * k * cin * cout + (cout if bias else 0)


def _bn(c: int) -> int:
    return 2 * c


def _cifar_resnet_count(n: int, filters: tuple[int, ...], num_classes: int) -> int:
    """Stem conv-BN, then per stage n BasicBlocks (two conv3×3-BN); a 1×1 conv-BN projection where the
    width or resolution changes (every stage's first block, except a same-width stage 1), then the FC."""
    stem, *widths = filters
    total, cin = _conv(3, stem) + _bn(stem), stem
    for i, w in enumerate(widths):
        for j in range(n):
            total += _conv(cin, w) + _bn(w) + _conv(w, w) + _bn(w)
            if j == 0 and (i > 0 or cin != w):
                total += _conv(cin, w, 1) + _bn(w)
            cin = w
    return total + cin * num_classes + num_classes


def _vgg_count(stages: list[list[int]], num_classes: int) -> int:
    """Every 3×3 conv has a bias and a BN; one FC on the 512-d pooled feature."""
    total, cin = 0, 3
    for c in (c for stage in stages for c in stage):
        total += _conv(cin, c, bias=True) + _bn(c)
        cin = c
    return total + cin * num_classes + num_classes


def _wrn_count(depth: int, k: int, num_classes: int) -> int:
    """Stem conv; pre-activation blocks BN-conv-BN-conv (+1×1 projection when the width changes); BN; FC."""
    n, total, cin = (depth - 4) // 6, _conv(3, 16), 16
    for w in (16 * k, 32 * k, 64 * k):
        for _ in range(n):
            total += _bn(cin) + _conv(cin, w) + _bn(w) + _conv(w, w) + (_conv(cin, w, 1) if cin != w else 0)
            cin = w
    return total + _bn(cin) + cin * num_classes + num_classes


@pytest.mark.parametrize("name", ["resnet8", "resnet14", "resnet20", "resnet110", "resnet8x4", "resnet32x4"])
def test_cifar_resnet_exact_count(name):
    depth = int(name[6:].split("x")[0])
    filters = (32, 64, 128, 256) if name.endswith("x4") else (16, 16, 32, 64)
    assert count_parameters(_model(name)) == _cifar_resnet_count((depth - 2) // 6, filters, 100)


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_vgg_exact_count(name):
    assert count_parameters(_model(name)) == _vgg_count(CONFIGS[name], 100)


@pytest.mark.parametrize("name", ["wrn_16_1", "wrn_16_2", "wrn_40_1", "wrn_40_2", "wrn_34_10"])
def test_wrn_exact_count(name):
    _, depth, k = name.split("_")
    assert count_parameters(_model(name)) == _wrn_count(int(depth), int(k), 100)


def test_wrn_34_10_published_parameter_count_at_10_classes():
    # 46.16M parameters at 10 classes: the WRN-34-10 of TRADES, AWP and IKL-AT (CIFAR-10).
    count = count_parameters(create_model("wrn_34_10", 10))
    assert count == 46_160_474 == _wrn_count(34, 10, 10)
    assert round(count / 1e6, 2) == 46.16


def test_small_net_sizes():
    assert count_parameters(_model("mlp")) == 784 * 512 + 512 + 512 * 256 + 256 + 256 * 10 + 10
    assert 0.05e6 < count_parameters(_model("convnet_small")) < 0.2e6
    assert 0.2e6 < count_parameters(_model("convnet")) < 1e6


# --- building blocks ----------------------------------------------------------------------------------


def test_standard_init():
    model = create_model("resnet8", 10)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm2d):
            assert torch.all(m.weight == 1) and torch.all(m.bias == 0)
    conv = [m for m in model.modules() if isinstance(m, nn.Conv2d)][-2]  # last 3×3 conv, 64 -> 64
    assert conv.kernel_size == (3, 3) and conv.out_channels == 64
    fan_out = conv.out_channels * 9
    assert conv.weight.std().item() == pytest.approx((2 / fan_out) ** 0.5, rel=0.05)


def test_channel_shuffle_matches_index_reference():
    x = torch.randn(2, 12, 3, 3)
    out = ChannelShuffle(3)(x)
    # Channel j*g + i of the output is channel i*(c/g) + j of the input (g groups of c/g channels).
    for i in range(3):
        for j in range(4):
            assert torch.equal(out[:, j * 3 + i], x[:, i * 4 + j])


def test_vgg_last_stage_resolution():
    pool = PoolIfLarge()
    assert pool(torch.randn(1, 2, 8, 8)).shape[-1] == 4
    assert pool(torch.randn(1, 2, 4, 4)).shape[-1] == 4
    assert pool(torch.randn(1, 2, 3, 3)).shape[-1] == 3


# --- errors ---------------------------------------------------------------------------------------------


def test_unknown_model_lists_choices_and_close_match():
    with pytest.raises(KdcollapseError) as err:
        create_model("resnet8x5", 10)
    message = str(err.value)
    assert "'resnet8x5'" in message and "Did you mean 'resnet8x4'" in message
    assert all(name in message for name in list_models())


def test_unknown_option_lists_valid_options():
    expected = r"no option\(s\) width_mul\. Valid options: width_mult, expansion"
    with pytest.raises(KdcollapseError, match=expected):
        create_model("mobilenetv2", 10, width_mul=1.0)
    with pytest.raises(KdcollapseError, match="Valid options: none"):
        create_model("resnet8", 10, pretrained=True)


def test_invalid_sizes():
    with pytest.raises(KdcollapseError, match="num_classes"):
        create_model("resnet8", 0)
    with pytest.raises(KdcollapseError, match="6n\\+2"):
        cifar_resnet(10, (16, 16, 32, 64), 10)
