"""Any nn.Module as student, teacher and analysis subject: the feature specs of ``as_classifier``."""

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.analysis import feature_pass
from kdcollapse.config import method_config
from kdcollapse.errors import KdcollapseError
from kdcollapse.methods import FrozenTeacher, build_method
from kdcollapse.models import Classifier, ModuleClassifier, as_classifier, create_model

K = 4


class TwoLayerCNN(nn.Module):
    """What a user writes: conv, ReLU, global pool, Linear; no kdcollapse seams."""

    def __init__(self, num_classes=K, width=6):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, 8, 3, padding=1),
                                  nn.ReLU())
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class TimmStyle(nn.Module):
    """timm's seams: forward_features -> a feature map, forward_head(pre_logits) pools then classifies."""

    def __init__(self, num_classes=K):
        super().__init__()
        self.stem = nn.Conv2d(1, 5, 3, padding=1)
        self.conv_head = nn.Linear(5, 7)  # timm's MobileNetV3 has a layer after pooling: pooled width != 5
        self.classifier = nn.Linear(7, num_classes)

    def forward_features(self, x):
        return F.relu(self.stem(x))

    def forward_head(self, x, pre_logits=False):
        x = F.relu(self.conv_head(x.mean((2, 3))))
        return x if pre_logits else self.classifier(x)

    def get_classifier(self):
        return self.classifier

    def forward(self, x):
        return self.forward_head(self.forward_features(x))


def images(n=10, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 6, 6, generator=g), torch.arange(n) % K


def explicit_cnn_features(net, x):
    return F.relu(net.body[2](F.relu(net.body[0](x)))).mean((2, 3))


def test_a_classifier_is_returned_as_is():
    model = create_model("mlp", K, in_channels=1, input_size=3, hidden=(5,))
    assert as_classifier(model) is model


@pytest.mark.parametrize("spec", [None, "fc", "body", lambda x: None])
def test_plain_cnn_hook_paths_give_the_explicit_features(spec):
    torch.manual_seed(0)
    net = TwoLayerCNN()
    if callable(spec):
        spec = lambda x: explicit_cnn_features(net, x)  # noqa: E731
    model = as_classifier(net, spec)
    x, _ = images()
    h = model.forward_features(x)
    torch.testing.assert_close(h, explicit_cnn_features(net, x), rtol=0, atol=0)
    torch.testing.assert_close(model.forward_head(h), net(x), rtol=0, atol=0)
    torch.testing.assert_close(model(x), net(x), rtol=0, atol=0)
    assert (model.num_classes, model.feature_dim, model.head) == (K, 8, net.fc)


def test_timm_style_uses_pre_logits_and_get_classifier():
    torch.manual_seed(0)
    net = TimmStyle()
    model = as_classifier(net)
    x, _ = images()
    h = model.forward_features(x)
    torch.testing.assert_close(h, net.forward_head(net.forward_features(x), pre_logits=True), rtol=0, atol=0)
    assert model.feature_dim == 7 and model.head is net.classifier
    torch.testing.assert_close(model.forward_head(h), net(x), rtol=0, atol=0)
    # the same features through a hook on the classifier's input
    torch.testing.assert_close(as_classifier(net, "classifier").forward_features(x), h, rtol=0, atol=0)


def test_state_dict_is_the_modules_and_head_is_not_registered_twice():
    net = TwoLayerCNN()
    model = as_classifier(net)
    assert list(model.state_dict()) == [f"module.{k}" for k in net.state_dict()]
    model.head = nn.Linear(8, K, bias=False)  # e.g. a spherical head: replaces the module's own classifier
    assert net.fc is model.head and "module.fc.bias" not in model.state_dict()


def test_bad_specs_name_the_options():
    with pytest.raises(KdcollapseError, match="features=\"timm\""):
        as_classifier(nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU()))
    with pytest.raises(KdcollapseError, match="no layer 'layer9'.*body, fc"):
        as_classifier(TwoLayerCNN(), "layer9")
    with pytest.raises(KdcollapseError, match="lacks them"):
        as_classifier(TwoLayerCNN(), "timm")
    with pytest.raises(KdcollapseError, match="expected 3 classes"):
        as_classifier(TwoLayerCNN(), num_classes=3)
    model = as_classifier(TwoLayerCNN(), "body.0")  # 6 channels do not feed the 8-wide classifier
    with pytest.raises(KdcollapseError, match=r"takes \(B, 8\); name the layer that feeds"):
        model.forward_features(images()[0])
    model = as_classifier(TwoLayerCNN().eval(), "body.2")  # 8 channels, but a ReLU follows
    with pytest.raises(KdcollapseError, match="is not the input of the classifier 'fc'"):
        model.forward_features(images()[0])


@pytest.mark.parametrize("method", ["kd", "dkd", "dhkd"])
def test_plain_student_distils_from_a_timm_style_teacher(method):
    torch.manual_seed(0)
    student, teacher = TwoLayerCNN(), TimmStyle()
    m = build_method(method_config({"name": method}), student, num_classes=K, teacher=FrozenTeacher(teacher))
    x, y = images(16)
    optimizer = torch.optim.SGD(m.parameters(), lr=0.1)
    before = student.fc.weight.detach().clone()
    out = m(x, y)
    out["loss"].backward()
    optimizer.step()
    assert torch.isfinite(out["loss"]) and not torch.equal(before, student.fc.weight)
    assert all(p.grad is None for p in teacher.parameters())
    assert isinstance(m.student, ModuleClassifier) and m.student.module is student
    torch.testing.assert_close(m.teacher(x)[1], teacher(x))


def test_timm_style_student_distils_from_a_plain_teacher():
    torch.manual_seed(0)
    m = build_method(method_config({"name": "kd"}), TimmStyle(), num_classes=K,
                     teacher=FrozenTeacher(TwoLayerCNN(), features="body"))
    x, y = images(16)
    m(x, y)["loss"].backward()
    assert m.student.module.stem.weight.grad is not None


@pytest.mark.parametrize("net_class", [TwoLayerCNN, TimmStyle])
def test_feature_pass_on_a_plain_module_matches_its_classifier(net_class):
    torch.manual_seed(0)
    net = net_class()
    batches = [images(8, seed) for seed in range(3)]
    result = feature_pass(net, batches, num_classes=K, teacher=TwoLayerCNN())
    reference = feature_pass(as_classifier(net), batches, num_classes=K, teacher=TwoLayerCNN())
    assert result.num_samples == 24 and result.stats.feature_dim == as_classifier(net).feature_dim
    torch.testing.assert_close(result.stats.class_means(), reference.stats.class_means())
    correct = sum(int((net(x).argmax(1) == y).sum()) for x, y in batches)
    assert result.correct["main"] == correct
    assert set(result.logit_matrices) == {"main"}


def test_registered_plain_factory_is_wrapped_by_create_model(monkeypatch):
    from kdcollapse.models import _MODELS, ModelInfo

    monkeypatch.setitem(_MODELS._entries, "byo_cnn",
                        ModelInfo("byo_cnn", lambda num_classes, in_channels: TwoLayerCNN(num_classes)))
    monkeypatch.setitem(_MODELS._entries, "byo_cnn_fixed",
                        ModelInfo("byo_cnn_fixed", lambda num_classes, in_channels: TwoLayerCNN(K)))
    model = create_model("byo_cnn", K, in_channels=1)
    assert isinstance(model, Classifier) and model.num_classes == K
    with pytest.raises(KdcollapseError, match="expected 3 classes"):
        create_model("byo_cnn_fixed", 3, in_channels=1)


@pytest.mark.parametrize("net_class", [TwoLayerCNN, TimmStyle])
def test_robust_evaluation_takes_a_plain_module(net_class):
    from kdcollapse.adversarial import pgd_evaluate

    torch.manual_seed(0)
    net = net_class().eval()
    x, y = images(8)
    x = x.sigmoid()  # images in [0, 1]
    result = pgd_evaluate(net, x, y, eps=8 / 255, steps=3, progress=False)
    assert result.clean_accuracy == (net(x).argmax(1) == y).float().mean().item()
    assert result.robust_accuracy <= result.clean_accuracy
    assert result.robust_accuracy == pgd_evaluate(as_classifier(net), x, y, eps=8 / 255, steps=3,
                                                  progress=False).robust_accuracy
