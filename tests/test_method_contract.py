"""The method contract (``kdcollapse.methods.Method``), checked for every registered method.

Each method gets the teacher, views and indices it declares (``teacher_request``, ``views``,
``needs_index``) and its default
options. Method-specific behaviour (loss values, gradient alignment, class weights, attacks) is tested in
the method's own test module; this file checks only what the trainer relies on for all of them.
"""

import functools
from pathlib import Path

import pytest
import torch
from torch import nn

from kdcollapse.config import load_config, method_config
from kdcollapse.data import load_dataset
from kdcollapse.methods import FrozenTeacher, build_method, get_method, list_methods
from kdcollapse.models import create_model
from kdcollapse.runs import load_tensors
from kdcollapse.train import fit

# The package's methods; tests may register private ones (tests/test_train.py), which this file skips.
METHODS = [name for name in list_methods() if get_method(name).__module__.startswith("kdcollapse.methods.")]
K, B = 10, 20  # digits classes; a batch with two images of each class


def identity(loss):
    return loss


@functools.cache
def digits():
    return load_dataset("digits", "train")


def batch_rows() -> torch.Tensor:
    """The dataset rows of ``digits_batch``: the first two images of each class."""
    return torch.cat([torch.nonzero(digits().labels == k)[:2, 0] for k in range(K)])


def digits_batch(views: int):
    """B digits, two per class, standardised with the dataset's statistics: (x, y, the dataset)."""
    data = digits()
    index = batch_rows()
    images, y = data.inputs[index].float() / 255, data.labels[index]
    x = (images - data.mean[0]) / data.std[0]
    if views > 1:  # independently augmented views in the trainer; here, a second view slightly shifted
        x = torch.stack([x, *[x.roll(v, dims=-1) for v in range(1, views)]], dim=1)
    return x, y, data


def tiny_model(name: str, width: int):
    """An MLP, or for methods reading stage maps a small CNN (digits are 8×8)."""
    request = get_method(name).teacher_request(method_config({"name": name}))
    if request is not None and request.stages:
        return create_model("convnet_small", K, in_channels=1)
    return create_model("mlp", K, in_channels=1, input_size=8, hidden=(width,))


def make(name: str):
    cls = get_method(name)
    torch.manual_seed(0)
    student = tiny_model(name, 16)
    teacher = None
    if cls.teacher_request(method_config({"name": name})) is not None:
        teacher = FrozenTeacher(tiny_model(name, 12))
    method = build_method(method_config({"name": name}), student, num_classes=K, teacher=teacher,
                          train_labels=digits().labels)
    method.set_input_normalization(digits().mean, digits().std)
    return method


def step(method, x, y):
    """``method(x, y)``, with the batch's dataset indices for a method that declares ``needs_index``."""
    return method(x, y, index=batch_rows()) if method.needs_index else method(x, y)


@pytest.fixture(params=METHODS)
def name(request):
    return request.param


@pytest.fixture
def method(name):
    return make(name)


def test_every_method_is_covered():
    assert len(METHODS) >= 14 and {"vanilla", "kd", "trades", "intra_class_teacher", "spherical"} <= set(METHODS)


def test_forward_backward_and_the_teacher(method):
    x, y, _ = digits_batch(method.views)
    method.train()
    method.on_epoch_start(0)
    out = step(method, x, y)
    assert out["loss"].shape == () and torch.isfinite(out["loss"]), out["loss"]
    assert out["logits"].shape == (B, K)
    for key, value in out.items():
        if key not in ("loss", "logits"):
            assert value.shape == () and torch.isfinite(value), key  # logged parts are finite scalars
    method.zero_grad(set_to_none=True)
    method.backward(out, identity)
    # Every trainable parameter gets a finite gradient (DDP without find_unused_parameters relies on it),
    # frozen ones none.
    params = dict(method.named_parameters())
    assert any(p.requires_grad and p.grad.abs().sum() > 0 for p in params.values())
    for n, p in params.items():
        assert (p.grad is not None) == p.requires_grad, n
        assert p.grad is None or torch.isfinite(p.grad).all(), n
    for buffer in method.buffers():
        assert buffer.grad is None
    if method.teacher is not None:  # the teacher: no gradient, and neither a parameter nor saved state
        teacher_params = [*method.teacher.model.parameters()]
        assert all(p.grad is None and not p.requires_grad for p in teacher_params)
        own = {id(p) for p in method.parameters()}
        assert not any(id(p) in own for p in teacher_params)
        assert not any(key.startswith("teacher") for key in method.state_dict())
    method.after_step()


def test_predict_and_inference_model_give_logits(method):
    x, _, _ = digits_batch(1)
    method.eval()
    with torch.no_grad():
        logits = method.predict(x)
        model = method.inference_model()
        assert isinstance(model, nn.Module)
        assert logits.shape == (B, K) and torch.isfinite(logits).all()
        assert model.eval()(x).shape == (B, K)


def test_extra_state_round_trips(name, method):
    x, y, _ = digits_batch(method.views)
    method.train()
    method.on_epoch_start(0)
    step(method, x, y)
    method.on_epoch_end(0)  # end-of-epoch state (class weights, caches) is what a checkpoint holds
    state = method.extra_state()
    assert all(isinstance(v, torch.Tensor) for v in state.values())
    fresh = make(name)
    fresh.load_extra_state({k: v.clone() for k, v in state.items()})
    again = fresh.extra_state()
    assert again.keys() == state.keys()
    for key in state:
        assert torch.equal(again[key], state[key]), key


def test_one_epoch_and_resume_equals_two_epochs(name, tmp_path, tiny_config, request):
    """The trainer's checkpoint (parameters, buffers, optimizer, ``extra_state``, random state) holds
    everything the method needs: 1 epoch + resume for 1 ends bit-identical to 2 epochs straight."""
    wants = get_method(name).teacher_request(method_config({"name": name}))
    maps = wants is not None and bool(wants.stages)  # stage maps: CNN student and teacher
    teacher = [] if wants is None else \
        [f"teacher.checkpoint={request.getfixturevalue('digits_conv_teacher' if maps else 'digits_teacher')}"]
    model = ["model.name=convnet_small", "model.kwargs={}"] if maps else []
    common = [f"method.name={name}", "data.train_per_class=4", "data.test_per_class=1", "data.batch_size=20",
              "data.crop_padding=1", *teacher, *model]
    straight = fit(tiny_config(tmp_path / "straight", *common, "train.epochs=2"))
    fit(tiny_config(tmp_path / "split", *common, "train.epochs=1"))
    fit(load_config(tmp_path / "split" / "config.yaml", ["train.epochs=2"]), resume=True)
    a, _ = load_tensors(Path(straight.run_dir) / "checkpoint.safetensors")
    b, _ = load_tensors(tmp_path / "split" / "checkpoint.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
