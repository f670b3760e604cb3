"""The DKL paper's Table 1 ablation as options of method ``dkl_kd``: (b) DKL, (c) + breaking the asymmetry,
(d) + global information (= IKL on DKL's scale). Each step changes exactly what the paper says it changes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kdcollapse.config import load_config, method_config
from kdcollapse.errors import ConfigError
from kdcollapse.losses import ikl_loss
from kdcollapse.methods import FrozenTeacher, build_method
from kdcollapse.models import create_model
from kdcollapse.runs import load_tensors
from kdcollapse.train import fit

K, TAU = 10, 4.0


def method(**options):
    torch.manual_seed(0)
    student = create_model("mlp", K, in_channels=1, input_size=8, hidden=(16,))
    teacher = FrozenTeacher(create_model("mlp", K, in_channels=1, input_size=8, hidden=(12,)))
    cfg = method_config({"name": "dkl_kd", "temperature": TAU, "ce_weight": 0.0, "kd_weight": 1.0, **options})
    return build_method(cfg, student, num_classes=K, teacher=teacher)


def batch():
    g = torch.Generator().manual_seed(1)
    return torch.randn(40, 1, 8, 8, generator=g), torch.arange(40) % K


def loss_and_grad(m, x, y):
    m.zero_grad()
    out = m(x, y)
    out["loss"].backward()
    return out["dkl"].detach(), torch.cat([p.grad.flatten() for p in m.student.parameters()])


def test_without_the_wmse_breaking_the_asymmetry_changes_nothing():
    x, y = batch()
    kept, broken = (loss_and_grad(method(alpha=0.0, breaking_asymmetry=b), x, y) for b in (False, True))
    torch.testing.assert_close(broken[0], kept[0], rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(broken[1], kept[1], rtol=1e-5, atol=1e-7)


def test_breaking_the_asymmetry_lets_the_wmse_train_the_student():
    x, y = batch()
    kept, broken = (loss_and_grad(method(alpha=1.0, breaking_asymmetry=b), x, y) for b in (False, True))
    ce_only = loss_and_grad(method(alpha=0.0), x, y)
    torch.testing.assert_close(kept[1], ce_only[1], rtol=1e-5, atol=1e-7)  # (b): the wMSE trains nothing
    assert (broken[1] - ce_only[1]).abs().max() > 1e-3  # (c): it does
    m = method(alpha=1.0, breaking_asymmetry=True)
    s, t = m.student(x), m.teacher.logits(x)
    expected = TAU**2 * ikl_loss(s / TAU, t / TAU, mse_weight=1.0, ce_weight=1.0)  # sample-wise weights
    torch.testing.assert_close(m(x, y)["dkl"], expected)


def test_global_information_weights_the_wmse_by_last_epochs_class_means():
    x, y = batch()
    m = method(alpha=1.0, breaking_asymmetry=True, global_information=True)
    m.train()
    m(x, y)  # epoch 1 observes the teacher; its own weights are uniform
    m.on_epoch_end(0)
    t = m.teacher.logits(x)
    means = torch.stack([(t[y == k] / TAU).softmax(1).mean(0) for k in range(K)])
    torch.testing.assert_close(m.class_means.table, means / means.sum(1, keepdim=True))
    s = m.student(x)
    expected = TAU**2 * ikl_loss(s / TAU, t / TAU, class_weights=m.class_means.table, target=y)
    m.eval()
    torch.testing.assert_close(m(x, y)["dkl"], expected)
    assert set(m.extra_state()) == {"class_weights", "class_weight_sums", "class_weight_counts"}


def test_global_information_needs_the_asymmetry_broken():
    with pytest.raises(ConfigError, match="set method.breaking_asymmetry=true too"):
        method_config({"name": "dkl_kd", "global_information": True})


def test_global_information_resumes_exactly(tmp_path, tiny_config, digits_teacher):
    common = ["method.name=dkl_kd", "method.breaking_asymmetry=true", "method.global_information=true",
              f"teacher.checkpoint={digits_teacher}"]
    straight = fit(tiny_config(tmp_path / "straight", *common, "train.epochs=3"))
    fit(tiny_config(tmp_path / "split", *common, "train.epochs=2"))
    fit(load_config(tmp_path / "split" / "config.yaml", ["train.epochs=3"]), resume=True)
    a, _ = load_tensors(Path(straight.run_dir) / "checkpoint.safetensors")
    b, _ = load_tensors(tmp_path / "split" / "checkpoint.safetensors")
    assert "extra.class_weights" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert not torch.allclose(a["extra.class_weights"], torch.full((K, K), 1 / K))  # the table was learned
