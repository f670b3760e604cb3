"""Adversarial training (methods ``trades`` and ``ikl_at``), its options (ε ramp, AWP, weight average),
WRN-34-10, and ``kdcollapse robust-eval``."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.adversarial import Normalized, parse_eps, trades_attack
from kdcollapse.cli import main
from kdcollapse.config import load_config, method_config
from kdcollapse.data import load_dataset
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.losses import ikl_at_loss, trades_loss
from kdcollapse.methods import build_method
from kdcollapse.methods._adversarial import WeightPerturbation, eps_schedule
from kdcollapse.methods._class_means import ClassMeanProbabilities
from kdcollapse.models import create_model
from kdcollapse.train import Trainer, fit
from kdcollapse.runs import load_model, load_tensors
from kdcollapse.distributed import distributed_teardown

MEAN, STD = (0.3,), (0.4,)
# How these runs differ from the tiny run (conftest.py): the mlp's default hidden layers, every test digit,
# a 3-step attack of radius 0.1.
RUN = ["data.batch_size=32", "data.train_per_class=16", "data.test_per_class=null", "model.kwargs={input_size: 8}",
       "method.eps=0.1", "method.step_size=0.05", "method.steps=3"]


def make_method(name: str, model: str = "convnet_small", **options):
    student = create_model(model, 10, in_channels=1, **({"input_size": 8} if model == "mlp" else {}))
    method = build_method(method_config({"name": name, "eps": 0.1, "step_size": 0.025, "steps": 5, **options}),
                          student, num_classes=10)
    method.set_input_normalization(MEAN, STD)
    return method


def digits_batch(n: int = 32):
    data = load_dataset("digits", "train")
    images, y = data.inputs[:n].float() / 255, data.labels[:n]
    return images, (images - MEAN[0]) / STD[0], y


def sgd_steps(method, x, y, steps: int, lr: float = 0.1) -> list[float]:
    optimizer = torch.optim.SGD(method.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        out = method(x, y)
        optimizer.zero_grad()
        method.backward(out, lambda loss: loss)
        optimizer.step()
        method.after_step()
        losses.append(out["loss"].item())
    return losses


# --- the methods' losses ------------------------------------------------------------------------------


@pytest.mark.parametrize("name, pinned", [("trades", (2.3132436275, 2.2287127972)),
                                          ("ikl_at", (11.5270519257, 11.4435405731))])
def test_two_training_steps_pinned(name, pinned):
    torch.manual_seed(0)
    method = make_method(name, model="mlp")
    _, x, y = digits_batch()
    losses = sgd_steps(method, x, y, steps=2)
    assert losses == pytest.approx(pinned, rel=1e-5)
    assert losses[1] < losses[0]


@pytest.mark.parametrize("name", ["trades", "ikl_at"])
def test_loss_is_the_loss_function_on_the_attack_output(name):
    """Forward = trades_attack on the [0, 1] images with the model in eval mode, then the loss of the
    natural and adversarial logits in train mode: same value, same parameter gradients, same BN state."""
    torch.manual_seed(0)
    method = make_method(name)
    reference = copy.deepcopy(method.student)
    images, x, y = digits_batch(16)
    method.train()
    torch.manual_seed(1)
    out = method(x, y)
    out["loss"].backward()

    torch.manual_seed(1)
    unit = (x * STD[0] + MEAN[0]).clamp(0, 1)  # what the method recovers from the standardised input
    assert torch.allclose(unit, images, atol=1e-6)
    adversarial = trades_attack(Normalized(reference, MEAN, STD), unit, eps=0.1, step_size=0.025, steps=5)
    reference.train()
    logits_adv = reference((adversarial - MEAN[0]) / STD[0])
    logits = reference(x)
    if name == "trades":
        loss = trades_loss(logits, logits_adv, y, beta=6.0)
    else:
        loss = ikl_at_loss(logits, logits_adv, y, torch.full((10, 10), 0.1), mse_weight=20.0, ce_weight=4.0)
    loss.backward()

    assert out["loss"].item() == pytest.approx(loss.item(), rel=1e-6)
    assert torch.equal(out["logits"], logits)
    assert out["ce"].item() == pytest.approx(F.cross_entropy(logits, y).item(), rel=1e-6)
    assert method.student.training
    for (key, p), q in zip(method.student.named_parameters(), reference.parameters()):
        assert torch.allclose(p.grad, q.grad, rtol=1e-5, atol=1e-7), key
    for key, value in reference.state_dict().items():  # running statistics: two train-mode forwards only
        assert torch.equal(method.student.state_dict()[key], value), key


def test_ikl_at_natural_side_gets_the_robust_gradient():
    """Breaking asymmetry: the IKL term trains the natural logits too (unlike a KD teacher)."""
    natural = torch.randn(4, 10, requires_grad=True)
    adversarial = torch.randn(4, 10)
    y = torch.tensor([0, 1, 2, 3])
    robust = ikl_at_loss(natural, adversarial, y, torch.full((10, 10), 0.1)) - F.cross_entropy(natural, y)
    (grad,) = torch.autograd.grad(robust, natural)
    assert grad.abs().sum() > 0


# --- class-wise weights -------------------------------------------------------------------------------


def test_class_weights_uniform_in_epoch_one_then_class_means():
    torch.manual_seed(0)
    method = make_method("ikl_at", model="mlp")
    _, x, y = digits_batch(32)
    y = y.clone()
    y[y == 9] = 8  # class 9 absent this epoch: its row keeps the previous (uniform) value
    method.train()
    method.on_epoch_start(0)
    assert torch.equal(method.class_means.weights(x), torch.full((10, 10), 0.1))
    seen = [method(x[:16], y[:16])["logits"], method(x[16:], y[16:])["logits"]]
    method.on_epoch_end(0)
    probs = F.softmax(torch.cat(seen).detach() / 4.0, dim=1)
    table = method.class_means.weights(x)
    for c in range(9):
        assert torch.allclose(table[c], probs[y == c].mean(0), atol=1e-6), c
    assert torch.equal(table[9], torch.full((10,), 0.1))
    assert torch.allclose(table.sum(1), torch.ones(10))
    # epoch 2 uses the table: the loss is ikl_at_loss with these class weights
    method.on_epoch_start(1)
    torch.manual_seed(3)
    out = method(x, y)
    reference = copy.deepcopy(method.student)
    torch.manual_seed(3)
    unit = (x * STD[0] + MEAN[0]).clamp(0, 1)
    adversarial = trades_attack(Normalized(reference, MEAN, STD), unit, eps=0.1, step_size=0.025, steps=5)
    expected = ikl_at_loss(reference(x), reference((adversarial - MEAN[0]) / STD[0]), y, table)
    assert out["loss"].item() == pytest.approx(expected.item(), rel=1e-6)


def test_class_mean_probabilities_state_and_errors():
    means = ClassMeanProbabilities(3, temperature=2.0)
    assert torch.equal(means.state()["class_weights"], torch.full((3, 3), 1 / 3))  # uniform before epoch 1
    means.observe(torch.tensor([[2.0, 0.0, 0.0], [0.0, 2.0, 0.0]]), torch.tensor([0, 0]))
    means.end_epoch()
    expected = (F.softmax(torch.tensor([1.0, 0.0, 0.0]), 0) + F.softmax(torch.tensor([0.0, 1.0, 0.0]), 0)) / 2
    assert torch.allclose(means.state()["class_weights"][0], expected)
    assert set(means.state()) == {"class_weights", "class_weight_sums", "class_weight_counts"}
    restored = ClassMeanProbabilities(3, temperature=2.0)
    restored.load_state(means.state())
    assert torch.equal(restored.weights(torch.empty(0)), means.weights(torch.empty(0)))
    # checkpoints of ikl_at written before the table was shared with ikl_kd hold the table alone
    old_format = ClassMeanProbabilities(3, temperature=2.0)
    old_format.load_state({"class_weights": means.table.clone()})
    assert torch.equal(old_format.table, means.table) and old_format.counts.sum() == 0
    with pytest.raises(CheckpointError, match=r"'class_weights' in the checkpoint is shape \(2, 2\); expected shape \(3, 3\)"):
        restored.load_state({"class_weights": torch.zeros(2, 2)})
    with pytest.raises(CheckpointError, match="'class_weights' in the checkpoint is missing"):
        restored.load_state({})
    with pytest.raises(ConfigError, match="temperature must be > 0"):
        ClassMeanProbabilities(3, temperature=0.0)


def test_resume_restores_class_weights_average_and_weights(tmp_path, tiny_config):
    """2 epochs straight == 1 epoch + resume for 1, with class weights, AWP (epoch 2) and the average."""
    options = ["method.name=ikl_at", "method.awp_gamma=0.01", "method.awp_from_epoch=2", "method.ema_decay=0.5",
               "method.ema_every=step"]
    straight = fit(tiny_config(tmp_path / "straight", *RUN, *options, "train.epochs=2"))
    fit(tiny_config(tmp_path / "split", *RUN, *options, "train.epochs=1"))
    fit(load_config(tmp_path / "split" / "config.yaml", ["train.epochs=2"]), resume=True)
    a, _ = load_tensors(Path(straight.run_dir) / "checkpoint.safetensors")
    b, _ = load_tensors(tmp_path / "split" / "checkpoint.safetensors")
    assert a.keys() == b.keys()
    assert "extra.class_weights" in a and any(k.startswith("method.average.model.") for k in a)
    assert not torch.allclose(a["extra.class_weights"], torch.full((10, 10), 0.1))
    for key in a:
        assert torch.equal(a[key], b[key]), key


# --- ε ramp, weight average, AWP ----------------------------------------------------------------------


def test_eps_warmup_schedule(monkeypatch):
    assert [eps_schedule(0.2, 4, e) for e in range(6)] == pytest.approx([0.05, 0.1, 0.15, 0.2, 0.2, 0.2])
    assert eps_schedule(0.2, 0, 0) == 0.2
    calls = []

    def spy(model, x, *, norm, eps, step_size, steps):
        calls.append((eps, step_size, steps))
        return x

    monkeypatch.setattr("kdcollapse.methods._adversarial.trades_attack", spy)
    method = make_method("trades", model="mlp", eps=0.2, step_size=0.05, eps_warmup_epochs=4)
    _, x, y = digits_batch(8)
    for epoch in (0, 1, 5):
        method.on_epoch_start(epoch)
        out = method(x, y)
        assert out["eps"].item() == pytest.approx(eps_schedule(0.2, 4, epoch))
    # the step size follows ε: a constant fraction (1/4) of it
    assert [c[2] for c in calls] == [5, 5, 5]
    assert [c[:2] for c in calls] == [pytest.approx(c) for c in [(0.05, 0.0125), (0.1, 0.025), (0.2, 0.05)]]


def test_weight_average_copies_then_averages():
    torch.manual_seed(0)
    method = make_method("trades", model="mlp", ema_decay=0.5, ema_every="step", ema_start_epoch=1)
    _, x, y = digits_batch(16)
    assert method.inference_model() is method.average.model
    method.on_epoch_start(0)
    sgd_steps(method, x, y, steps=2)
    for p, q in zip(method.average.model.parameters(), method.student.parameters()):
        assert torch.equal(p, q)  # epochs up to ema_start_epoch: a copy
    before = [p.clone() for p in method.average.model.parameters()]
    method.on_epoch_start(1)
    sgd_steps(method, x, y, steps=1)
    for p, q, old in zip(method.average.model.parameters(), method.student.parameters(), before):
        assert torch.allclose(p, 0.5 * old + 0.5 * q)
        assert not p.requires_grad
    assert torch.equal(method.predict(x), method.average.model(x))
    assert all(id(p) not in {id(q) for q in method.average.parameters()}
               for p in [p for p in method.parameters() if p.requires_grad])


def test_weight_average_is_the_model_file(tmp_path, tiny_config):
    cfg = tiny_config(tmp_path / "ema", *RUN, "method.name=trades", "method.ema_decay=0.9", "train.epochs=2")
    trainer = Trainer(cfg)  # the trainer tells the method how its inputs were standardised
    assert (trainer.method.input_mean, trainer.method.input_std) == (trainer.train_set.mean, trainer.train_set.std)
    run = trainer.run()
    model, meta = load_model(run.run_dir)
    tensors, _ = load_tensors(Path(run.run_dir) / "checkpoint.safetensors")
    for key, value in model.state_dict().items():
        assert torch.equal(value, tensors[f"method.average.model.{key}"]), key
    assert not torch.equal(model.state_dict()["head.weight"], tensors["method.student.head.weight"])
    assert meta["method"] == "trades"


def test_awp_perturbs_by_normalised_gradient_and_restores():
    torch.manual_seed(0)
    model = create_model("convnet_small", 10, in_channels=1)
    model.train()
    x, y = torch.randn(8, 1, 8, 8), torch.randint(0, 10, (8,))
    loss_fn = lambda net: F.cross_entropy(net(x), y)  # noqa: E731
    reference = copy.deepcopy(model)
    grads = dict(zip([n for n, _ in reference.named_parameters()],
                     torch.autograd.grad(loss_fn(reference), list(reference.parameters()))))
    before = copy.deepcopy(model.state_dict())
    awp = WeightPerturbation(gamma=0.01)
    awp.perturb(model, loss_fn)
    for name, w in model.named_parameters():
        old = before[name]
        if w.ndim > 1:
            g = grads[name]
            assert torch.allclose(w - old, 0.01 * old.norm() * g / g.norm(), atol=1e-7), name
        else:
            assert torch.equal(w, old), name  # biases and BN affine parameters are not perturbed
    for name, buffer in model.named_buffers():
        assert torch.equal(buffer, before[name]), name  # the proxy's forward left the BN statistics alone
    assert all(p.grad is None for p in model.parameters())
    with torch.no_grad():  # the perturbation ascends the loss (train mode, as the gradient was taken)
        assert loss_fn(model) > loss_fn(reference)
    with pytest.raises(RuntimeError, match="not restored"):
        awp.perturb(model, loss_fn)
    awp.restore(model)
    for name, w in model.named_parameters():
        assert torch.allclose(w, before[name], atol=1e-7), name


def test_awp_step_is_the_gradient_at_the_perturbed_weights():
    """w ← (w + v) − η∇L(w + v) − v (Wu et al. 2020, Algorithm 1) with plain SGD, through the method."""
    torch.manual_seed(0)
    method = make_method("trades", model="mlp", awp_gamma=0.02, awp_from_epoch=1)
    _, x, y = digits_batch(16)
    start = copy.deepcopy(method.student.state_dict())
    torch.manual_seed(5)
    sgd_steps(method, x, y, steps=1, lr=0.1)

    reference = make_method("trades", model="mlp")
    reference.student.load_state_dict(start)
    torch.manual_seed(5)
    images = (x * STD[0] + MEAN[0]).clamp(0, 1)
    adversarial = trades_attack(Normalized(reference.student, MEAN, STD), images, eps=0.1, step_size=0.025, steps=5)
    x_adv = (adversarial - MEAN[0]) / STD[0]
    loss_fn = lambda net: trades_loss(net(x), net(x_adv), y)  # noqa: E731
    WeightPerturbation(0.02).perturb(reference.student, loss_fn)
    perturbed = dict(reference.student.named_parameters())
    grads = torch.autograd.grad(loss_fn(reference.student), list(perturbed.values()))
    for (name, p), g in zip(method.student.named_parameters(), grads):
        assert torch.allclose(p, start[name] - 0.1 * g, atol=1e-6), name
    assert any(n.endswith("weight") for n in start)


def _ddp_worker(rank: int, world_size: int, port: int, out_dir: str) -> None:
    """One process of a 2-process gloo group: class means and AWP on this process's own batch."""
    import os

    import torch.distributed as dist
    from safetensors.torch import save_file

    torch.set_num_threads(1)  # a forked child must not start OpenMP's thread pool (see the caller)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    with distributed_teardown():
        logits, y, x, model = _ddp_inputs(rank)
        means = ClassMeanProbabilities(3, temperature=2.0)
        means.observe(logits, y)
        means.end_epoch()
        WeightPerturbation(0.05).perturb(model, lambda net: F.cross_entropy(net(x), y))
        save_file({"table": means.state()["class_weights"], **model.state_dict()}, f"{out_dir}/rank{rank}.safetensors")


def _ddp_inputs(rank: int):
    g = torch.Generator().manual_seed(rank)
    logits, y = torch.randn(6, 3, generator=g), torch.randint(0, 3, (6,), generator=g)
    y[0] = rank  # class 2 is seen by one process only
    torch.manual_seed(0)
    return logits, y, torch.randn(6, 4, generator=g), torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(),
                                                                          torch.nn.Linear(8, 3))


def test_class_means_and_awp_are_synchronised_across_processes(tmp_path):
    import socket

    from safetensors.torch import load_file

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    # fork, not spawn: the children start without importing torch again (a few seconds each)
    torch.multiprocessing.start_processes(_ddp_worker, args=(2, port, str(tmp_path)), nprocs=2, start_method="fork")
    results = [load_file(tmp_path / f"rank{r}.safetensors") for r in range(2)]
    inputs = [_ddp_inputs(r) for r in range(2)]
    # class means over the union of both processes' samples
    logits, y = torch.cat([i[0] for i in inputs]), torch.cat([i[1] for i in inputs])
    probs = F.softmax(logits / 2.0, dim=1)
    expected = torch.stack([probs[y == c].mean(0) for c in range(3)])
    # AWP from the gradient averaged over the processes (equal batches: the gradient of the mean loss)
    model = inputs[0][3]
    loss = sum(F.cross_entropy(model(i[2]), i[1]) for i in inputs) / 2
    grads = dict(zip([n for n, _ in model.named_parameters()], torch.autograd.grad(loss, list(model.parameters()))))
    for result in results:
        assert torch.allclose(result["table"], expected, atol=1e-6)
        for name, w in model.named_parameters():
            g = grads[name]
            shift = 0.05 * w.norm() * g / g.norm() if w.ndim > 1 else 0
            assert torch.allclose(result[name], w.detach() + shift, atol=1e-6), name
    for key in results[0]:
        assert torch.equal(results[0][key], results[1][key]), key


# --- configuration errors ----------------------------------------------------------------------------


@pytest.mark.parametrize("override, message", [
    ("method.eps=abc", "method.eps must be a number or a fraction"),
    ("method.eps=8", r"did you mean 8/255"),
    ("method.step_size=-0.1", "method.step_size must be positive"),
    ("method.steps=0", "method.steps must be >= 1"),
    ("method.ema_decay=1.0", r"ema_decay must lie in \[0, 1\)"),
    ("method.awp_gamma=-1", "awp_gamma must be >= 0"),
    ("method.ema_every=sometimes", "must be one of step, epoch"),
    ("method.norm=L1", "must be one of Linf, L2"),
])
def test_config_errors(override, message):
    with pytest.raises(ConfigError, match=message):
        cfg = load_config(None, ["method.name=trades", override])
        build_method(cfg.method, create_model("mlp", 10, in_channels=1, input_size=8), num_classes=10)


def test_fractions_in_config_and_label_smoothing_refused(tmp_path):
    cfg = load_config(None, ["method.name=ikl_at", "method.eps=8/255", "method.step_size=2/255"])
    method = build_method(cfg.method, create_model("mlp", 10, in_channels=1, input_size=8), num_classes=10)
    assert (method.eps, method.step_size) == (8 / 255, 2 / 255)
    assert parse_eps("8/255") == 8 / 255 and parse_eps(0.5, norm="L2") == 0.5 and parse_eps("1.5", norm="L2") == 1.5
    with pytest.raises(ConfigError, match="label_smoothing=0"):
        build_method(cfg.method, create_model("mlp", 10, in_channels=1, input_size=8), num_classes=10,
                     label_smoothing=0.1)


def test_vector_data_refused(tmp_path):
    cfg = load_config(None, ["data.name=gaussian_mixture", "model.name=mlp", "model.kwargs={input_size: 1}",
                             "method.name=trades", "train.epochs=1", "train.progress=false",
                             f"run_dir={tmp_path / 'vec'}"])
    with pytest.raises(KdcollapseError, match=r"trains on images \(B, C, H, W\).*vector dataset"):
        fit(cfg)


# --- robust-eval ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_run(tmp_path_factory, tiny_config):
    run_dir = tmp_path_factory.mktemp("runs") / "trades"
    fit(tiny_config(run_dir, *RUN, "method.name=trades", "train.epochs=1"))
    return run_dir


REDUCED = ["--aa-iterations", "4", "--aa-targets", "2", "--aa-queries", "16", "--no-progress"]


def test_robust_eval_cli_end_to_end(tiny_run, capsys):
    assert main(["robust-eval", str(tiny_run), "--eps", "0.1", "--n-examples", "12", *REDUCED]) == 0
    printed = capsys.readouterr().out
    assert "clean accuracy" in printed and "robust accuracy" in printed and "images/s" in printed
    entries = json.loads((tiny_run / "robust_eval.json").read_text())
    assert set(entries) == {"autoattack-reduced Linf eps=0.1 last", "pgd-20 Linf eps=0.1 last"}
    aa = entries["autoattack-reduced Linf eps=0.1 last"]
    assert aa["n"] == 12 and aa["eps"] == 0.1 and aa["budget"] == {"n_iter": 4, "n_targets": 2, "n_queries": 16}
    assert [s["attack"] for s in aa["stages"]] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert aa["robust_accuracy"] <= aa["clean_accuracy"]
    assert aa["dataset"] == "digits" and aa["method"] == "trades"
    # a second evaluation adds its entry and keeps the others
    assert main(["robust-eval", str(tiny_run), "--eps", "1/10", "--attacks", "pgd", "--pgd-steps", "3",
                 "--n-examples", "12", "--no-progress"]) == 0
    entries = json.loads((tiny_run / "robust_eval.json").read_text())
    assert "pgd-3 Linf eps=1/10 last" in entries and len(entries) == 3
    report = (tiny_run / "robust_eval.md").read_text()
    assert "| pgd-3 Linf ε=1/10 | model.safetensors | 12 |" in report


def test_robust_eval_defaults_to_autoattack_standard(tiny_run, monkeypatch):
    from kdcollapse.adversarial import _registry
    from kdcollapse.adversarial._evaluate import evaluate_attacks
    from kdcollapse.experiments import robust_eval

    called = {}

    def standard(model, x, y, *, norm, eps, batch_size, seed, progress, **search):  # the real one takes minutes
        called.update(norm=norm, eps=eps, n=len(x), lo=x.min().item(), hi=x.max().item(), **search)
        return evaluate_attacks(model, x, y, [], norm=norm, eps=eps, batch_size=batch_size, progress=progress)

    monkeypatch.setattr(_registry, "autoattack_standard", standard)
    entries = robust_eval.evaluate_run(tiny_run, eps="8/255", attacks=["standard"], n_examples=20, progress=False)
    assert list(entries) == ["autoattack-standard Linf eps=8/255 last"]
    assert called["norm"] == "Linf" and called["eps"] == 8 / 255 and called["n"] == 20
    assert 0 <= called["lo"] and called["hi"] <= 1  # images in [0, 1], not standardised
    assert called["precision"] == "off" and called["channels_last"] is False  # the default search is float32
    x, _ = robust_eval.load_test_images("digits", n_examples=5)
    assert torch.equal(x, load_dataset("digits", "test").inputs[:5].float() / 255)


class LiesUnderAutocast(torch.nn.Module):
    """Correct in float32; under autocast it predicts class (y + 1) mod K for every input."""

    def __init__(self, model):
        super().__init__()
        self.model, self.autocast_calls = model, 0

    def forward(self, x):
        logits = self.model(x)
        if torch.is_autocast_enabled("cpu"):
            self.autocast_calls += 1
            return 10 * F.one_hot((logits.argmax(1) + 1) % logits.shape[1], logits.shape[1]).float()
        return logits


def test_a_bf16_search_attacks_in_bf16_but_every_verdict_is_float32(tiny_linear_model):
    from kdcollapse.adversarial._evaluate import evaluate_attacks

    model = LiesUnderAutocast(tiny_linear_model)
    x = torch.rand(24, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    y = tiny_linear_model(x).argmax(1)  # every point starts correct
    looks_fooled = []

    def identity_attack(m, xb, yb):  # returns the clean input, after looking at the model it was given
        looks_fooled.append(bool((m(xb).argmax(1) != yb).all()))
        return xb.clone()

    result = evaluate_attacks(model, x, y, [("look", identity_attack)], norm="Linf", eps=0.1, batch_size=8,
                              progress=False, precision="bf16", channels_last=True)
    assert looks_fooled == [True, True, True] and model.autocast_calls == 3  # the search ran under autocast
    assert result.clean_accuracy == 1.0 and result.robust_accuracy == 1.0  # ... the verdicts did not


def test_a_bf16_search_finds_what_the_float32_search_finds(tiny_linear_model):
    from kdcollapse.adversarial import pgd_evaluate

    x = torch.rand(200, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    y = tiny_linear_model(x).argmax(1)
    runs = {p: pgd_evaluate(tiny_linear_model, x, y, eps=0.2, steps=10, progress=False, precision=p)
            for p in ("off", "bf16")}
    assert 0.2 < runs["off"].robust_accuracy < 0.9  # the attack breaks some points, not all
    assert abs(runs["bf16"].robust_accuracy - runs["off"].robust_accuracy) <= 0.02


def test_robust_eval_records_the_search_precision(tiny_run):
    from kdcollapse.experiments import robust_eval

    entries = robust_eval.evaluate_run(tiny_run, eps="0.1", attacks=["pgd"], pgd_steps=3, n_examples=12,
                                       progress=False, precision="bf16", channels_last=True)
    (entry,) = entries.values()
    assert entry["search_precision"] == "bf16" and entry["search_channels_last"] is True
    with pytest.raises(ConfigError, match="precision=fp16 needs a CUDA device"):
        robust_eval.evaluate_run(tiny_run, eps="0.1", attacks=["pgd"], n_examples=4, progress=False,
                                 precision="fp16")


@pytest.mark.parametrize("args, message", [
    (["--eps", "abc"], "eps must be a number or a fraction such as 8/255"),
    (["--eps", "8"], "did you mean 8/255"),
    (["--eps", "0/255"], "eps must be positive"),
    (["--attacks", "fgsm"], "unknown attack 'fgsm'.*pgd, standard"),
    (["--attacks", ","], "no attack chosen"),
    (["--n-examples", "0"], "--n-examples: must be an integer >= 1, got '0'"),
    (["--pgd-steps", "0"], "--pgd-steps: must be an integer >= 1, got '0'"),
])
def test_robust_eval_bad_input(tiny_run, capsys, args, message):
    assert main(["robust-eval", str(tiny_run), *args, "--no-progress"]) == 2
    assert __import__("re").search(message, capsys.readouterr().err)


def test_robust_eval_missing_run_and_non_image_data(tmp_path, capsys):
    assert main(["robust-eval", str(tmp_path / "nowhere")]) == 2
    assert "run directory not found" in capsys.readouterr().err
    assert main(["robust-eval", str(tmp_path)]) == 2
    assert "holds no config.yaml" in capsys.readouterr().err
    vec = tmp_path / "vec"
    fit(load_config(None, ["data.name=gaussian_mixture", "model.name=mlp", "model.kwargs={input_size: 1}",
                           "train.epochs=1", "train.progress=false", f"run_dir={vec}"]))
    assert main(["robust-eval", str(vec), "--eps", "0.1", "--attacks", "pgd"]) == 2
    assert "attacks uint8 images scaled to [0, 1]; dataset 'gaussian_mixture' holds torch.float32" \
        in capsys.readouterr().err
