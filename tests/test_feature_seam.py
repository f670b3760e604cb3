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
from kdcollapse.models import Classifier, FeatureInfo, as_classifier, create_model, list_models, model_info
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
    assert len(info) >= model_info(name).min_stages  # what its registration promises
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


def test_shufflev2_and_mobilenetv2_pre_activation_maps_against_mdistiller():
    """mdistiller (a08d46f, models/cifar/ShuffleNetv2.py BasicBlock.forward): the last unit of a stage returns
    preact = cat([x1, bn3(conv3(...))]), concatenated but *not* shuffled, while its output is shuffled. Ours is
    the same map shuffled like the output (its channels line up with the post-activation map, relu(pre) ==
    post): a fixed channel permutation of mdistiller's. MobileNetV2's stages end linearly (pw-linear BN, then
    the residual sum), so pre and post maps are equal (mdistiller defines no preact_feats for it)."""
    m = model("shufflev2").eval()
    x = inputs("shufflev2")
    with torch.no_grad():
        _, pre = m.forward_intermediates(x, [1], pre_act=True)
        _, post = m.forward_intermediates(x, [1])
        end = m.feature_info[1].module.split(".")[1]
        unit_input = m.body[: int(end)](x)
        unit = m.body[int(end)]
        x1, x2 = unit_input.chunk(2, dim=1)
        branch = unit.branch
        h = branch[1][0](branch[0](x2))  # 1×1 conv-BN-ReLU, depthwise conv-BN
        bn3 = branch[1][1][1](branch[1][1][0](h))  # the last 1×1 conv and its BN, before the ReLU
        official = torch.cat([x1, bn3], 1)
        torch.testing.assert_close(pre[0], unit.shuffle(official))
        torch.testing.assert_close(torch.relu(pre[0]), post[0])
        assert not torch.allclose(pre[0], official)
        m2 = model("mobilenetv2").eval()
        _, pre2 = m2.forward_intermediates(inputs("mobilenetv2"), [1, 2, 3, 4], pre_act=True)
        _, post2 = m2.forward_intermediates(inputs("mobilenetv2"), [1, 2, 3, 4])
    assert all(torch.equal(a, b) for a, b in zip(pre2, post2))


def test_bad_stage_indices_name_the_range():
    m = model("resnet8")
    with pytest.raises(KdcollapseError, match="has 4 stages"):
        m.forward_intermediates(inputs("resnet8"), [4])
    for indices in ([0], 1):
        with pytest.raises(KdcollapseError, match="no stage outputs"):
            model("mlp").forward_intermediates(inputs("mlp"), indices)


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


@pytest.mark.parametrize("aux_head", ["linear", "mlp"])
def test_extra_heads_travel_in_the_model_file_and_are_read_without_the_method(tmp_path, tiny_config, digits_teacher,
                                                                              monkeypatch, aux_head):
    from kdcollapse import methods
    from kdcollapse.runs import Run, load_tensors

    fit(tiny_config(tmp_path, "method.name=dhkd", f"method.aux_head={aux_head}", f"teacher.checkpoint={digits_teacher}",
                    "train.epochs=1"))
    tensors, meta = load_tensors(tmp_path / "model.safetensors")
    assert any(k.startswith("extra_heads.aux.") for k in tensors) and "aux" in meta["extra_heads"]
    checkpoint, _ = load_tensors(tmp_path / "checkpoint.safetensors")
    monkeypatch.setattr(methods, "build_method", None)  # reading a run builds no method
    run = Run(tmp_path)
    model, meta = run.model()
    (aux,) = run.heads(model, meta).values()
    for key, value in aux.state_dict().items():
        assert torch.equal(value, checkpoint[f"method.aux_head.{key}"]), key
    assert not aux.training


INDEX_PROBE = '''
from dataclasses import dataclass
import torch
from kdcollapse.distributed import all_gather_cat
from kdcollapse.methods import Method, register_method

@register_method("_index_probe")
class IndexProbe(Method):
    needs_index = True

    @dataclass
    class Config:
        pass

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        self.register_buffer("seen", torch.zeros(self.num_samples, dtype=torch.long))

    def forward(self, x, y, index=None):
        self.seen[all_gather_cat(index)] += 1  # a global bank: every process applies every process's rows
        logits = self.student(x)
        return {"loss": self.cross_entropy(logits, y), "logits": logits}
'''


@pytest.mark.slow
def test_torchrun_batches_carry_global_dataset_indices(tmp_path, tiny_overrides):
    """Under DDP over 2 gloo processes each batch carries its samples' indices in the (subset) training set:
    the two shares are disjoint and cover it once per epoch, and a bank updated with the gathered indices
    stays the same on every process."""
    from ranks import run_ranks

    from kdcollapse.runs import load_tensors, read_metrics

    (tmp_path / "index_probe.py").write_text(INDEX_PROBE)
    empty_yaml = tmp_path / "empty.yaml"
    empty_yaml.write_text("{}\n")
    args = ["--import", "index_probe", "train", "--config", str(empty_yaml), *tiny_overrides,
            "method.name=_index_probe", "train.epochs=2", "data.batch_size=20", "data.classes=[0, 2, 4, 6, 8]",
            f"run_dir={tmp_path / 'ddp'}"]
    proc = run_ranks(args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = load_tensors(tmp_path / "ddp" / "checkpoint.safetensors")[0]["method.seen"]
    assert len(seen) == 5 * 20 and (seen == 2).all()
    assert read_metrics(tmp_path / "ddp")[-1]["ranks_in_sync"] is True
