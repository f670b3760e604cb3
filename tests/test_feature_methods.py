"""The methods of issue 23 (DIST, PKT; FitNet, AT, OFD, NST, SP on the feature seam): their losses as the
official code combines them, with the official default weights, stages and trainable parts."""

import functools
from copy import deepcopy as copy_module
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.config import load_config, method_config
from kdcollapse.errors import ConfigError
from kdcollapse.losses import at_loss, dist_loss, ofd_loss, ofd_margin, pkt_loss
from kdcollapse.methods.fitnet import ConvRegressor
from kdcollapse.methods import FrozenTeacher, build_method
from kdcollapse.models import create_model
from naming import raises_naming

K = 10


def mlp(hidden, seed):
    torch.manual_seed(seed)
    return create_model("mlp", K, in_channels=1, input_size=8, hidden=hidden)


def test_dist_method_is_ce_plus_twice_dist_at_tau_4():
    """hunto/image_classification_sota/configs/strategies/distill/dist_cifar.yaml: ori_loss_weight 1,
    kd_loss_weight 2, kd dist_t4 (β = γ = 1, τ = 4)."""
    student, teacher = mlp((16,), 0), FrozenTeacher(mlp((12,), 1))
    method = build_method(method_config({"name": "dist"}), student, num_classes=K, teacher=teacher)
    x, y = torch.randn(12, 1, 8, 8), torch.arange(12) % K
    out = method(x, y)
    logits, teacher_logits = student(x), teacher.logits(x)
    expected = F.cross_entropy(logits, y) + 2 * dist_loss(logits, teacher_logits, 1.0, 1.0, 4.0)
    torch.testing.assert_close(out["loss"], expected)
    torch.testing.assert_close(out["ce"] + out["dist"], out["loss"])


def test_pkt_method_is_ce_plus_weighted_pkt_on_penultimate_features():
    """mdistiller PKT.forward_train: CE + 30000·pkt_loss(pooled_feat_s, pooled_feat_t)."""
    student, teacher = mlp((16,), 0), FrozenTeacher(mlp((12,), 1))
    method = build_method(method_config({"name": "pkt"}), student, num_classes=K, teacher=teacher)
    x, y = torch.randn(12, 1, 8, 8), torch.arange(12) % K
    out = method(x, y)
    h = student.forward_features(x)
    expected = F.cross_entropy(student.forward_head(h), y) + 30000 * pkt_loss(h, teacher(x)[0])
    torch.testing.assert_close(out["loss"], expected)


# --- methods on stage maps ----------------------------------------------------------------------

def cifar_pair(student_name, teacher_name, method, **options):
    torch.manual_seed(0)
    student, teacher = create_model(student_name, K), FrozenTeacher(create_model(teacher_name, K))
    built = build_method(method_config({"name": method, **options}), student, num_classes=K, teacher=teacher)
    return built, student, teacher


def batch(size=16):
    g = torch.Generator().manual_seed(1)
    return torch.randn(6, 3, size, size, generator=g), torch.arange(6) % K


def test_fitnet_method_is_ce_plus_100_mse_of_the_regressed_hint():
    method, student, teacher = cifar_pair("resnet8", "resnet14", "fitnet")
    x, y = batch()
    out = method(x, y)
    h, (guided,) = student.forward_intermediates(x, [2])
    hint = teacher.read(x, method.teacher_request(method.config)).maps[0]
    expected = F.cross_entropy(student.forward_head(h), y) + 100 * F.mse_loss(method.regressor(guided), hint)
    torch.testing.assert_close(out["loss"], expected)
    # The regressor trains with the student but is not part of the deployed model.
    assert any(p is method.regressor.conv.weight for p in method.parameters())
    assert not any(k.startswith("regressor") for k in method.inference_model().state_dict())


@pytest.mark.parametrize("s_size,t_size,kind", [(8, 4, torch.nn.Conv2d), (4, 8, torch.nn.ConvTranspose2d),
                                                (8, 8, torch.nn.Conv2d), (6, 4, torch.nn.Conv2d)])
def test_conv_regressor_maps_onto_the_teacher_shape(s_size, t_size, kind):
    """mdistiller ConvReg: stride-2 conv, stride-2 transposed conv, or a (1 + H_s − H_t) kernel."""
    reg = ConvRegressor(3, 5, (s_size, s_size), (t_size, t_size))
    assert type(reg.conv) is kind
    assert reg(torch.randn(2, 3, s_size, s_size)).shape == (2, 5, t_size, t_size)
    with pytest.raises(ConfigError, match="no regressor"):
        ConvRegressor(3, 5, (2, 2), (8, 8))


def test_at_method_is_ce_plus_1000_at_on_the_stages_after_the_stem():
    method, student, teacher = cifar_pair("resnet8", "resnet14", "at")
    x, y = batch()
    out = method(x, y)
    h, maps = student.forward_intermediates(x, [1, 2, 3])
    t_maps = teacher.model.forward_intermediates(x, [1, 2, 3])[1]
    expected = F.cross_entropy(student.forward_head(h), y) + 1000 * at_loss(maps, t_maps, 2.0)
    torch.testing.assert_close(out["loss"], expected)


def train_mode_maps(teacher, x, stages, norms=()):
    """mdistiller's OFD teacher: its pre-ReLU maps with the whole network in train mode (``OFD.train`` does
    not put it back in eval mode), on a copy, since train mode moves the running statistics. ``norms``: the
    teacher's BatchNorm applied after each map (WRN: ``preact_feats = block2.layer[0].bn1(f1)``), or None."""
    copy = copy_module(teacher.model).train()
    names = {id(m): name for name, m in teacher.model.named_modules()}
    with torch.no_grad():
        maps = copy.forward_intermediates(x, stages, pre_act=True)[1]
        if not norms:
            return maps
        return [m if bn is None else copy.get_submodule(names[id(bn)])(m) for m, bn in zip(maps, norms)]


def test_ofd_margins_come_from_the_batchnorm_before_each_stage_relu():
    """ResNet: the last BN of the stage's last block (mdistiller's ``bn2``), before the shortcut is added."""
    method, student, teacher = cifar_pair("resnet8", "resnet14", "ofd")
    for i, stage in enumerate([1, 2, 3]):
        block = teacher.model.get_submodule(teacher.feature_info[stage].module)
        bn = [m for m in block.branch.modules() if isinstance(m, torch.nn.BatchNorm2d)][-1]
        torch.testing.assert_close(method.margins()[i], ofd_margin(bn.weight, bn.bias).float())
    assert {k.split(".")[0] for k in method.state_dict()} == {"student", "connectors", "margin_0", "margin_1",
                                                              "margin_2"}


@pytest.mark.parametrize("teacher_bn", ["batch", "running"])
def test_ofd_loss_reads_the_teacher_with_the_chosen_batchnorm_statistics(teacher_bn):
    """Default ``batch``: the teacher's maps as mdistiller's OFD computes them, with its teacher in train mode;
    the teacher's running statistics and mode stay as loaded. ``running``: the teacher in eval mode."""
    method, student, teacher = cifar_pair("resnet8", "resnet14", "ofd", teacher_bn=teacher_bn)
    for m in teacher.model.modules():  # running statistics unlike any batch's, so the two modes differ
        if isinstance(m, torch.nn.BatchNorm2d):
            m.running_mean.uniform_(-1, 1), m.running_var.uniform_(0.5, 2)
    before = {k: v.clone() for k, v in teacher.model.state_dict().items()}
    x, y = batch()
    out = method(x, y)
    h, maps = student.forward_intermediates(x, [1, 2, 3], pre_act=True)
    if teacher_bn == "batch":
        t_maps = train_mode_maps(teacher, x, [1, 2, 3])
    else:
        t_maps = teacher.model.forward_intermediates(x, [1, 2, 3], pre_act=True)[1]
    other = teacher.model.forward_intermediates(x, [1, 2, 3], pre_act=True)[1] if teacher_bn == "batch" else \
        train_mode_maps(teacher, x, [1, 2, 3])
    connected = [c(m) for c, m in zip(method.connectors, maps)]
    expected = F.cross_entropy(student.forward_head(h), y) + 1e-3 * ofd_loss(connected, t_maps, method.margins())
    torch.testing.assert_close(out["loss"], expected)
    assert not torch.allclose(ofd_loss(connected, other, method.margins()), expected - out["ce"])
    assert not teacher.model.training and not any(m.training for m in teacher.model.modules())
    for k, v in teacher.model.state_dict().items():
        assert torch.equal(v, before[k]), k
    with pytest.raises(ConfigError, match="method.teacher_bn must be one of batch, running, got 'train'"):
        method_config({"name": "ofd", "teacher_bn": "train"})


def test_ofd_on_a_preactivation_teacher_normalises_its_maps_with_the_next_batchnorm():
    """WRN (mdistiller: preact_feats = block2.layer[0].bn1(f1), ..., bn1(f3); margins from the same BNs), with
    the batch's statistics in those BatchNorms too."""
    method, student, teacher = cifar_pair("wrn_16_1", "wrn_16_2", "ofd")
    body = teacher.model.body
    ends = [int(teacher.feature_info[s].module.split(".")[1]) for s in (1, 2, 3)]
    expected = [body[ends[0] + 1].preact[0], body[ends[1] + 1].preact[0], body[ends[2] + 1][0]]
    assert all(a is b for a, b in zip(method._teacher_norms, expected))
    for margin, bn in zip(method.margins(), expected):
        torch.testing.assert_close(margin, ofd_margin(bn.weight, bn.bias).float())
    x, y = batch()
    out = method(x, y)
    h, maps = student.forward_intermediates(x, [1, 2, 3], pre_act=True)
    connected = [c(m) for c, m in zip(method.connectors, maps)]
    t_maps = train_mode_maps(teacher, x, [1, 2, 3], expected)
    loss = F.cross_entropy(student.forward_head(h), y) + 1e-3 * ofd_loss(connected, t_maps, method.margins())
    torch.testing.assert_close(out["loss"], loss)


def test_stage_options_are_checked_against_the_models():
    with raises_naming(ConfigError, "method.teacher_stages", "[7]", "teacher", "0 (", "2 ("):
        cifar_pair("resnet8", "resnet14", "at", teacher_stages=[1, 2, 7])
    with pytest.raises(ConfigError, match="equal lengths"):
        cifar_pair("resnet8", "resnet14", "nst", teacher_stages=[1, 2])


# --- every recipe of these methods builds on its pair ----------------------------------------------

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
RECIPES = sorted(p for area in ("cifar100", "imagenet") for method in ("fitnet", "at", "ofd", "nst", "sp", "dist")
                 for p in (CONFIGS / area / method).glob("*.yaml"))


@functools.cache
def zoo_model(name, k):
    torch.manual_seed(0)
    return create_model(name, k)


@pytest.mark.slow
def test_every_recipe_builds_on_its_pair_and_fitnet_regresses_onto_the_hint():
    """Stage lists, regressor shapes and OFD's BatchNorms fit the recipe's models (fresh weights); the FitNet
    regressor maps the student's map onto the teacher's exact shape at 32×32."""
    assert len(RECIPES) == 11 + 11 + 1 + 6 + 2 + 2 + 2
    for path in RECIPES:
        cfg = load_config(path)
        k = 1000 if path.parts[-3] == "imagenet" else 100
        teacher = FrozenTeacher(zoo_model(Path(cfg.teacher.checkpoint).name.removeprefix("teacher_"), k))
        method = build_method(cfg.method, zoo_model(cfg.model.name, k), num_classes=k, teacher=teacher)
        if cfg.method.name == "fitnet":
            x = torch.randn(1, 3, 32, 32)
            with torch.no_grad():
                (guided,) = method.student.eval().forward_intermediates(x, [cfg.method.student_stage])[1]
                (hint,) = teacher.read(x, method.request).maps
                assert method.regressor.eval()(guided).shape == hint.shape, path.name
