"""The feature seam (issue 23): ``forward_intermediates`` / ``feature_info`` on every model, the stages of
a user's module through hooks, the teacher's one typed output, a method's own trainable modules and
parameter groups, and the batch's dataset indices."""

import functools
from dataclasses import dataclass

import pytest
import torch
from torch import nn

from kdcollapse.config import method_config
from kdcollapse.errors import KdcollapseError
from kdcollapse.methods import FrozenTeacher, Method, TeacherRequest, register_method
from kdcollapse.models import Classifier, FeatureInfo, as_classifier, create_model, list_models
from kdcollapse.train import fit
from kdcollapse.train._optim import build_optimizer, build_schedule

SMALL = {"mlp", "convnet_small", "convnet"}


@functools.cache
def model(name: str) -> Classifier:
    torch.manual_seed(0)
    if name == "mlp":
        return create_model(name, 5, in_channels=1, input_size=8)
    return create_model(name, 5, in_channels=3)


def side(name: str) -> int:
    """The smallest input side with every stage at least 1×1 (the largest reduction; 8 at least): fast."""
    return max([8, *(i.reduction for i in model(name).feature_info)])


def inputs(name: str) -> torch.Tensor:
    return torch.randn(2, 1 if name == "mlp" else 3, side(name), side(name), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("name", list_models())
def test_forward_intermediates_match_feature_info_in_every_mode(name):
    """Shapes, channels and reductions as ``feature_info`` says; the feature is ``forward_features``; eval and
    train mode, channels-last and bf16 autocast."""
    m, x, n = model(name), inputs(name), side(name)
    info = m.feature_info
    assert [i.stage for i in info] == list(range(len(info)))
    assert all(isinstance(i, FeatureInfo) and m.get_submodule(i.module) is not None for i in info)
    if name != "mlp":
        assert len(info) >= 3
    m.eval()
    with torch.no_grad():
        h, maps = m.forward_intermediates(x)
        torch.testing.assert_close(h, m.forward_features(x))
        assert len(maps) == len(info)
        for i, f in zip(info, maps):
            assert f.shape == (2, i.channels, n // i.reduction, n // i.reduction), (i, f.shape)
        if info:
            _, last = m.forward_intermediates(x, [-1])  # negative indices count from the end
            torch.testing.assert_close(last[0], maps[-1])
            _, pre = m.forward_intermediates(x, pre_act=True)
            for f, p in zip(maps, pre):  # the ReLU of the pre-activation map is the map, or the map itself
                assert p.shape == f.shape
                assert torch.equal(torch.relu(p), f) or torch.equal(p, f)
        if name not in SMALL:
            with torch.autocast("cpu", dtype=torch.bfloat16):
                hb, mb = m.to(memory_format=torch.channels_last).forward_intermediates(
                    x.contiguous(memory_format=torch.channels_last), indices=len(info))
            m.to(memory_format=torch.contiguous_format)
            assert [f.shape for f in mb] == [f.shape for f in maps] and hb.shape == h.shape
            assert (hb.float() - h).norm() < 0.05 * h.norm()  # bf16 rounding only
    m.train()
    h, maps = m.forward_intermediates(x, indices=2 if info else None)
    assert len(maps) == min(2, len(info))
    (h.sum() + sum(f.sum() for f in maps)).backward()  # differentiable through the maps
    m.zero_grad(set_to_none=True)
    m.eval()


def test_pre_activation_maps_are_before_the_relu():
    m = model("resnet8").eval()
    with torch.no_grad():
        _, pre = m.forward_intermediates(inputs("resnet8"), pre_act=True)
    assert all((p < 0).any() for p in pre)  # OFD's features keep their negative part


def test_bad_stage_indices_name_the_range():
    m = model("resnet8")
    with pytest.raises(KdcollapseError, match="has 4 stages"):
        m.forward_intermediates(inputs("resnet8"), [4])
    with pytest.raises(KdcollapseError, match="no stage outputs"):
        model("mlp").forward_intermediates(inputs("mlp"), [0])


class UserNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.block1 = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU())
        self.block2 = nn.Sequential(nn.Conv2d(8, 12, 3, stride=2, padding=1), nn.BatchNorm2d(12), nn.ReLU())
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(12, 4)

    def forward(self, x):
        return self.fc(self.pool(self.block2(self.block1(x))).flatten(1))


def test_a_users_module_gives_its_named_layers_as_stages():
    net = UserNet().eval()
    m = as_classifier(net, stages=("block1", "block2.1"), input_shape=(3, 16, 16))
    assert [(i.channels, i.reduction, i.module) for i in m.feature_info] == [(8, 1, "block1"), (12, 2, "block2.1")]
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        h, (a, b) = m.forward_intermediates(x)
        torch.testing.assert_close(h, net.pool(net.block2(net.block1(x))).flatten(1))
        torch.testing.assert_close(a, net.block1(x))
        torch.testing.assert_close(b, net.block2[1](net.block2[0](net.block1(x))))  # before the ReLU
    with pytest.raises(KdcollapseError, match="needs input_shape"):
        as_classifier(UserNet(), stages=("block1",))
    with pytest.raises(KdcollapseError, match="has no layer 'nope'"):
        as_classifier(UserNet(), stages=("nope",), input_shape=(3, 16, 16))
    with pytest.raises(KdcollapseError, match="name the layer before the activation"):
        m.forward_intermediates(x, pre_act=True)


def test_the_teacher_answers_the_request_in_float32():
    t = FrozenTeacher(model("resnet8"))
    x = inputs("resnet8")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = t.read(x, TeacherRequest(features=True, stages=(1, 3), pre_act=True))
    assert out.logits.dtype == out.features.dtype == torch.float32 and out.logits.shape == (2, 5)
    assert [m.shape[1] for m in out.maps] == [16, 64] and all(m.dtype == torch.float32 for m in out.maps)
    assert not any(m.is_inference() for m in out.maps)
    plain = t.read(x)
    assert plain.features is None and plain.maps == () and torch.equal(plain.logits, t.logits(x))


@register_method("_seam_probe")
class SeamProbe(Method):
    """A test-only feature method: a 1×1 connector from the student's stage 1 to the teacher's, trained at
    twice the learning rate without weight decay, and the batch's dataset indices recorded."""

    needs_index = True

    @dataclass
    class Config:
        hint: bool = True  # false: no teacher, no connector

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(stages=(1,), pre_act=True) if config.hint else None

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        s = self.student.feature_info[1].channels
        t = self.teacher.feature_info[1].channels if config.hint else s
        self.connector = nn.Conv2d(s, t, 1)
        self.register_buffer("seen", torch.zeros(self.num_samples, dtype=torch.long))

    def optimizer_groups(self):
        return [{"params": list(self.student.parameters())},
                {"params": list(self.connector.parameters()), "lr_scale": 2.0, "weight_decay": 0.0}]

    def forward(self, x, y, index=None):
        h, (f,) = self.student.forward_intermediates(x, [1])
        logits = self.student.forward_head(h)
        target = self.read_teacher(x).maps[0] if self.config.hint else torch.zeros_like(f, dtype=torch.float32)
        hint = (self.connector(f).float() - target).square().mean()
        self.seen[index] += 1
        ce = self.cross_entropy(logits, y)
        return {"loss": ce + hint, "logits": logits, "hint": hint.detach()}


def test_a_feature_method_trains_its_connector_and_deploys_only_the_student(tmp_path, tiny_config,
                                                                          digits_conv_teacher):
    from kdcollapse.runs import Run, load_tensors

    common = ["method.name=_seam_probe", "model.name=convnet_small", "model.kwargs={}", "train.epochs=2"]
    fit(tiny_config(tmp_path / "run", *common, f"teacher.checkpoint={digits_conv_teacher}"))
    state, _ = load_tensors(tmp_path / "run" / "checkpoint.safetensors")
    assert {"method.connector.weight", "method.seen"} <= state.keys()
    assert (state["method.seen"] == 2).all()  # every training sample, once per epoch, by its index
    fit(tiny_config(tmp_path / "subset", *common, "method.hint=false", "data.classes=[1, 3, 5, 7]"))
    subset, _ = load_tensors(tmp_path / "subset" / "checkpoint.safetensors")
    assert len(subset["method.seen"]) == 4 * 20 and (subset["method.seen"] == 2).all()  # the subset's rows
    deployed, _ = load_tensors(tmp_path / "run" / "model.safetensors")
    assert not any("connector" in k or "seen" in k for k in deployed)
    model_, _ = Run(tmp_path / "run").model()
    assert set(model_.state_dict()) == set(deployed)


def test_parameter_groups_scale_the_learning_rate_through_the_schedule(tiny_config, tmp_path):
    cfg = tiny_config(tmp_path, "schedule.name=cosine", "train.epochs=2", "optim.weight_decay=5e-4")
    a, b = nn.Linear(2, 2), nn.Linear(2, 2)
    opt = build_optimizer(cfg, [{"params": list(a.parameters())},
                                {"params": list(b.parameters()), "lr_scale": 2.0, "weight_decay": 0.0}])
    schedule = build_schedule(cfg, opt, 4)
    for _ in range(3):
        opt.step()
        schedule.step()
    lr0, lr1 = (g["lr"] for g in opt.param_groups)
    assert lr1 == pytest.approx(2 * lr0) and lr0 < cfg.optim.lr
    assert [g["weight_decay"] for g in opt.param_groups] == [5e-4, 0.0]
