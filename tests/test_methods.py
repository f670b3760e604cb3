"""Distillation methods: gradient alignment, dual heads, IKL class weights, DDP, bad input."""

import json
import os
from pathlib import Path

import pytest
from ranks import free_port
import torch
import torch.multiprocessing as mp

from kdcollapse.config import load_config, method_config
from kdcollapse.data import load_dataset, make_loader
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.losses import binary_kl_norm_loss, dkd_loss, ikl_loss, kd_loss
from kdcollapse.methods import FrozenTeacher, build_method, get_method, list_methods
from kdcollapse.methods._dual_head import align_gradients
from kdcollapse.models import create_model
from kdcollapse.train import fit
from kdcollapse.runs import load_model, load_tensors
from kdcollapse.distributed import distributed_teardown

K, D = 5, 9  # classes; input values (a 1x3x3 "image" for the mlp)
# Methods of the package with a teacher that the MLPs here can serve (stage-map methods need CNNs; their own
# modules test them; tests register others).
DISTILLERS = [name for name in list_methods()
              if get_method(name).__module__.startswith("kdcollapse.methods.")
              and (request := get_method(name).teacher_request(method_config({"name": name}))) is not None
              and not request.stages and not get_method(name).needs_index]  # crd: tests/test_methods_crd_reviewkd_vid.py


def mlp(num_classes=K, hidden=(12,), seed=0):
    torch.manual_seed(seed)
    return create_model("mlp", num_classes, in_channels=1, input_size=3, hidden=hidden)


def make(name, teacher_classes=K, num_classes=K, **section):
    teacher = FrozenTeacher(mlp(teacher_classes, hidden=(16,), seed=1))
    cfg = method_config({"name": name, **section})
    return build_method(cfg, mlp(num_classes), num_classes=num_classes, teacher=teacher)


def batch(n=16, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, D, generator=g), torch.randint(0, K, (n,), generator=g)


def identity(t):
    return t


def flat_grad(loss, params):
    grads = torch.autograd.grad(loss, params, retain_graph=True, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).flatten() for g, p in zip(grads, params)])


def ordered_params(m):
    """Backbone, main head g, auxiliary head g' — written out here, independently of the method."""
    backbone = [p for name, p in m.student.named_parameters() if not name.startswith("head.")]
    return backbone, [*m.student.head.parameters()], [*m.aux_head.parameters()]


def test_every_method_is_registered():
    assert {"kd", "dkd", "ce_binarykl", "dkl_kd", "dhkd", "dual_head_kd", "ikl_kd"} <= set(DISTILLERS)


# ------------------------------------------------------------------------------ gradient alignment
def test_align_gradients_formula_and_sign():
    g = torch.Generator().manual_seed(0)
    for trial in range(20):
        g_ce, g_kd = torch.randn(2, 30, generator=g, dtype=torch.float64)
        n = 30 if trial % 2 else 17  # global, or the first 17 entries only
        out = align_gradients(g_ce, g_kd, n)
        a, b = g_ce[:n], g_kd[:n]
        dot = float(b @ a)
        expected = g_ce + g_kd
        if dot < 0:
            expected[:n] -= dot / float(a @ a) * a
        torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
        assert float((out - g_ce)[:n] @ a) >= -1e-10  # the aligned distillation gradient never opposes CE
        torch.testing.assert_close(out[n:], (g_ce + g_kd)[n:])  # outside the projected block: the plain sum
    # Opposite gradients cancel the opposing component exactly; a zero CE gradient projects nothing.
    v = torch.tensor([1.0, 2.0, 0.0])
    torch.testing.assert_close(align_gradients(v, -2 * v + torch.tensor([0, 0, 3.0]), 3), v + torch.tensor([0, 0, 3.0]))
    torch.testing.assert_close(align_gradients(torch.zeros(3), v, 3), v)


def conflicting_setup(alignment):
    m = make("dhkd", alignment=alignment)
    with torch.no_grad():
        m.aux_head.weight.copy_(-m.student.head.weight)
        m.aux_head.bias.copy_(-m.student.head.bias)
    x, _ = batch()
    return m, x, m.teacher_logits(x).argmax(1)


def conflicting_step(alignment):
    """A DHKD step whose distillation gradient opposes CE: g' = -g, so raising the teacher's top class
    on g' lowers it on g, where CE (with that class as the label) wants it higher."""
    m, x, y = conflicting_setup(alignment)
    out = m(x, y)
    backbone, g, aux = ordered_params(m)
    params = backbone + g + aux
    g_ce, g_kd = flat_grad(out["ce"], params), flat_grad(out["binary_kl_norm"], params)
    m.zero_grad()
    m.backward(out, identity)
    update = torch.cat([p.grad.flatten() for p in params])
    sizes = [sum(p.numel() for p in ps) for ps in (backbone, g, aux)]
    return m, g_ce, g_kd, update, sizes


def test_global_alignment_is_the_official_update():
    m, g_ce, g_kd, update, sizes = conflicting_step("global")
    dot = g_kd @ g_ce
    assert dot < 0  # the case the projection exists for
    expected = g_ce + g_kd - dot / (g_ce @ g_ce) * g_ce
    torch.testing.assert_close(update, expected, rtol=1e-5, atol=1e-7)
    assert (update - g_ce) @ g_ce >= -1e-6 * g_ce.norm() ** 2
    # Globally, the main head g receives extra CE gradient (the projection subtracts a multiple of G_CE).
    nb, ng, _ = sizes
    assert not torch.allclose(update[nb:nb + ng], g_ce[nb:nb + ng])


def test_shared_alignment_projects_the_backbone_and_leaves_the_heads_alone():
    m, g_ce, g_kd, update, (nb, ng, na) = conflicting_step("shared")
    a, b = g_ce[:nb], g_kd[:nb]
    assert b @ a < 0
    torch.testing.assert_close(update[:nb], a + b - (b @ a) / (a @ a) * a, rtol=1e-5, atol=1e-7)
    assert (update[:nb] - a) @ a >= -1e-6 * a.norm() ** 2
    assert torch.equal(update[nb:nb + ng], g_ce[nb:nb + ng])  # g: exactly its CE gradient
    assert torch.equal(update[nb + ng:], g_kd[nb + ng:])  # g': exactly its distillation gradient


def test_alignment_off_is_plain_backward():
    m = make("dhkd")
    x, y = batch()
    out = m(x, y)
    params = [*m.parameters()]
    expected = flat_grad(out["loss"], params)
    m.backward(out, identity)
    torch.testing.assert_close(torch.cat([p.grad.flatten() for p in params]), expected)
    assert not m.manual_gradient_sync


# ---------------------------------------------------------------------------------------- dual head
@pytest.mark.parametrize("name,part,aux_head", [("dhkd", "binary_kl_norm", "linear"), ("dhkd", "binary_kl_norm", "mlp"),
                                                ("dual_head_kd", "kd", "linear")])
def test_dual_head_losses_touch_only_their_own_head(name, part, aux_head):
    m = make(name, aux_head=aux_head)
    x, y = batch()
    out = m(x, y)
    aux, g = [*m.aux_head.parameters()], [*m.student.head.parameters()]
    assert all(grad is None for grad in torch.autograd.grad(out["ce"], aux, retain_graph=True, allow_unused=True))
    assert all(grad is None for grad in torch.autograd.grad(out[part], g, retain_graph=True, allow_unused=True))
    backbone = ordered_params(m)[0]
    for loss in (out["ce"], out[part]):  # both reach the backbone
        assert flat_grad(loss, backbone).abs().sum() > 0
    torch.testing.assert_close(out["loss"], out["ce"] + out[part])
    # Prediction and reported accuracy use the main head only.
    torch.testing.assert_close(m.predict(x), m.student(x))
    torch.testing.assert_close(out["logits"], m.student(x))
    assert any(k.startswith("aux_head.") for k in m.state_dict())  # optimizer and checkpoint see g'


def test_dhkd_loss_value_and_distill_until():
    m = make("dhkd", alpha=0.5, temperature=2.0, distill_until=3)
    x, y = batch()
    out = m(x, y)
    h = m.student.forward_features(x)
    expected = 0.5 * binary_kl_norm_loss(m.aux_head(h), m.teacher_logits(x), 2.0)
    torch.testing.assert_close(out["binary_kl_norm"], expected)
    calls = []
    m.teacher = CountingTeacher(m.teacher, calls)
    m.on_epoch_start(2)
    m(x, y)
    assert len(calls) == 1
    m.on_epoch_start(3)  # the 4th epoch: distillation off, no teacher pass, zero term
    out = m(x, y)
    assert len(calls) == 1 and out["binary_kl_norm"].item() == 0.0
    grads = torch.autograd.grad(out["loss"], [*m.aux_head.parameters()])
    assert all(torch.equal(gr, torch.zeros_like(gr)) for gr in grads)  # present (DDP needs it) but zero


class CountingTeacher:
    def __init__(self, teacher, calls):
        self.teacher, self.calls, self.num_classes = teacher, calls, teacher.num_classes

    def __call__(self, x):
        self.calls.append(1)
        return self.teacher(x)

    def read(self, x, request):  # the teacher protocol: methods read their request's TeacherOutput
        self.calls.append(1)
        return self.teacher.read(x, request)


# ----------------------------------------------------------------------------------- other losses
def test_kd_dkd_and_ramp_values():
    x, y = batch()
    m = make("kd")
    out = m(x, y)
    s, t = m.student(x), m.teacher_logits(x)
    torch.testing.assert_close(out["kd"], 0.9 * kd_loss(s, t, 4.0))
    torch.testing.assert_close(out["ce"], 0.1 * torch.nn.functional.cross_entropy(s, y))
    m = make("dkd")
    for epoch, factor in [(0, 1 / 20), (9, 10 / 20), (19, 1.0), (50, 1.0)]:
        m.on_epoch_start(epoch)
        torch.testing.assert_close(m(x, y)["dkd"], factor * dkd_loss(s, t, y, 1.0, 8.0, 4.0))


def test_dkl_kd_has_the_gradients_of_kd():
    """DKL paper Lemma 1: with a frozen teacher, DKL (alpha = beta = 1) gives exactly KD's gradients."""
    x, y = batch()
    grads = []
    for name in ("kd", "dkl_kd"):
        m = make(name)
        out = m(x, y)
        grads.append(flat_grad(out["loss"], [*m.parameters()]))
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-5, atol=1e-7)


# ------------------------------------------------------------------------------ IKL class weights
def test_ikl_class_weights_accumulate_and_blend():
    m = make("ikl_kd", weight_temperature=2.0, momentum=0.5, warmup_epochs=0)
    torch.testing.assert_close(m.class_means.table, torch.full((K, K), 1 / K))
    x, y = batch(40)
    y[:5] = torch.arange(5)  # every class present...
    y[y == 4] = 3  # ...except class 4 after all
    m(x[:25], y[:25])
    m(x[25:], y[25:])
    probs = torch.softmax(m.teacher_logits(x) / 2.0, 1)
    m.on_epoch_end(0)
    for k in range(K):
        if k == 4:
            torch.testing.assert_close(m.class_means.table[k], torch.full((K,), 1 / K))  # absent: row kept
        else:
            torch.testing.assert_close(m.class_means.table[k], 0.5 * probs[y == k].mean(0) + 0.5 / K)
    assert m.class_means.counts.sum() == 0  # accumulators reset for the next epoch
    out = m(x, y)
    expected = ikl_loss(m.student(x), m.teacher_logits(x), class_weights=m.class_means.table, target=y,
                        mse_weight=1.0, ce_weight=1.0, temperature=4.0)
    torch.testing.assert_close(out["ikl"], expected)
    counted = m.class_means.counts.clone()
    m.eval()
    m(x, y)  # evaluation passes never count
    assert torch.equal(m.class_means.counts, counted)


def test_ikl_kd_weights_through_the_trainer_and_resume(tmp_path, digits_teacher, tiny_config):
    common = ["method.name=ikl_kd", "method.weight_temperature=1.0", f"teacher.checkpoint={digits_teacher}"]
    straight = fit(tiny_config(tmp_path / "a", *common, "train.epochs=2"))
    fit(tiny_config(tmp_path / "b", *common, "train.epochs=1"))
    resumed = fit(load_config(tmp_path / "b" / "config.yaml", ["train.epochs=2"]), resume=True)
    a = load_tensors(Path(straight.run_dir) / "checkpoint.safetensors")[0]
    b = load_tensors(Path(resumed.run_dir) / "checkpoint.safetensors")[0]
    assert {"extra.class_weights", "extra.class_weight_sums", "extra.class_weight_counts"} <= a.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    # After epoch 1 the weights are the class means of the teacher's probabilities over the training set
    # (no augmentation here, so the epoch sees every training image once, as the evaluation loader does).
    teacher, _ = load_model(digits_teacher)
    data = load_dataset("digits", "train").subset(20, seed=0)
    with torch.no_grad():
        probs, labels = zip(*[(torch.softmax(teacher.eval()(x), 1), y)
                              for x, y in make_loader(data, 64, train=False, device="cpu", seed=0)])
    probs, labels = torch.cat(probs), torch.cat(labels)
    means = torch.stack([probs[labels == k].mean(0) for k in range(10)])
    first = fit(tiny_config(tmp_path / "c", *common, "train.epochs=1"))
    weights = load_tensors(Path(first.run_dir) / "checkpoint.safetensors")[0]["extra.class_weights"]
    torch.testing.assert_close(weights, means, rtol=1e-5, atol=1e-6)
    # A frozen teacher on un-augmented data gives epoch 2 the same means again.
    torch.testing.assert_close(a["extra.class_weights"], weights)


def test_ikl_kd_refuses_foreign_state():
    m = make("ikl_kd")
    with pytest.raises(CheckpointError, match="class_weights.*missing"):
        m.load_extra_state({})
    with pytest.raises(CheckpointError, match=r"shape \(3, 3\)"):
        m.load_extra_state({"class_weights": torch.ones(3, 3)})


# -------------------------------------------------------------------------------------- DDP (gloo)
def _ddp_worker(rank, port, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    with distributed_teardown():
        torch.save(_ddp_results(rank), Path(out_dir) / f"rank{rank}.pt")


def _ddp_results(rank):
    """This rank's gradients and IKL class weights (the DDP modules are gone when it returns)."""
    from torch.nn.parallel import DistributedDataParallel

    results = {}
    x, y = batch(16)
    for alignment in ("global", "shared"):
        m, _, y_conflict = conflicting_setup(alignment)
        model = DistributedDataParallel(m)
        half = slice(8 * rank, 8 * rank + 8)
        with model.no_sync():  # what the trainer does for manual_gradient_sync methods
            out = model(x[half], y_conflict[half])
            m.backward(out, identity)
        results[alignment] = torch.cat([p.grad.flatten() for p in m.parameters()])
    m = make("ikl_kd")
    m(x[8 * rank:8 * rank + 8], y[8 * rank:8 * rank + 8])
    m.on_epoch_end(0)
    results["ikl"] = m.class_means.table
    m = make("ctkd")  # CTKD's learned temperature: its reversed gradient is averaged like the student's
    m.on_epoch_start(3)
    model = DistributedDataParallel(m)  # held: a collected wrapper takes its gradient hooks with it
    model(x[8 * rank:8 * rank + 8], y[8 * rank:8 * rank + 8])["loss"].backward()
    results["ctkd"] = torch.cat([p.grad.flatten() for p in m.parameters()])
    return results


def test_ddp_two_processes_align_the_global_batch_gradients(tmp_path):
    """Two gloo ranks with 8 samples each give the one-process 16-sample update: both gradients are
    averaged over the ranks before the projection; IKL's class sums are all-reduced; CTKD's temperature
    parameter gets the averaged reversed gradient."""
    # fork, not spawn: the children start without importing torch again (a few seconds each)
    mp.start_processes(_ddp_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="fork")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    x, y = batch(16)
    for alignment in ("global", "shared"):
        m, _, y_conflict = conflicting_setup(alignment)
        out = m(x, y_conflict)
        m.backward(out, identity)
        expected = torch.cat([p.grad.flatten() for p in m.parameters()])
        for r in ranks:
            torch.testing.assert_close(r[alignment], expected, rtol=1e-4, atol=1e-6)
    m = make("ikl_kd")
    m(x, y)
    m.on_epoch_end(0)
    for r in ranks:
        torch.testing.assert_close(r["ikl"], m.class_means.table)
    m = make("ctkd")
    m.on_epoch_start(3)
    m(x, y)["loss"].backward()
    for r in ranks:
        torch.testing.assert_close(r["ctkd"], torch.cat([p.grad.flatten() for p in m.parameters()]),
                                   rtol=1e-4, atol=1e-7)


# --------------------------------------------------------------------------------------- bad input
def test_teacher_and_student_must_share_classes(tmp_path, digits_teacher):
    with pytest.raises(KdcollapseError, match="teacher has 3 classes, student has 5"):
        make("kd", teacher_classes=3)
    with pytest.raises(ConfigError, match="distils from a teacher"):
        build_method(method_config({"name": "dhkd"}), mlp(), num_classes=K, teacher=None)
    # Through the trainer: a teacher of another dataset is refused before anything trains.
    cfg = load_config(None, ["data.name=gaussian_mixture", "train.progress=false", "model.name=mlp",
                             "method.name=kd", f"teacher.checkpoint={digits_teacher}", f"run_dir={tmp_path / 'g'}"])
    with pytest.raises(CheckpointError, match="trained on 'digits', but this run uses 'gaussian_mixture'"):
        fit(cfg)


def test_dkd_needs_three_classes():
    with pytest.raises(ConfigError, match="'dkd' needs at least 3 classes.*has 2"):
        make("dkd", teacher_classes=2, num_classes=2)


@pytest.mark.parametrize("name", DISTILLERS)
def test_nan_logits_are_named(name):
    m = make(name)
    x, y = batch()
    x[3, 0] = float("nan")
    if m.views > 1:  # the same (poisoned) image as every view
        x = torch.stack([x] * m.views, dim=1)
    with pytest.raises(KdcollapseError, match="contains NaN or inf"):
        m(x, y)


@pytest.mark.parametrize("section,message", [
    ({"name": "dhkd", "alignment": "always"}, "'method.alignment' must be one of off, global, shared"),
    ({"name": "dhkd", "aux_head": "deep"}, "'method.aux_head' must be one of linear, mlp"),
    ({"name": "kd", "temperature": 0}, "method.temperature must be > 0, got 0"),
    ({"name": "dkd", "beta": -1}, "method.beta must be >= 0"),
    ({"name": "ikl_kd", "momentum": 1.5}, r"method.momentum must be in \(0, 1\]"),
    ({"name": "dhkd", "distill_until": -2}, "method.distill_until must be >= 0"),
    ({"name": "kd", "alpha": 1}, "unknown key 'method.alpha'.*Valid keys: ce_weight, kd_weight, logit_standardization, temperature"),
])
def test_bad_method_config(section, message):
    with pytest.raises(ConfigError, match=message):
        method_config(section)


@pytest.mark.slow
def test_torchrun_dhkd_alignment_matches_one_process(tmp_path, digits_teacher, tiny_overrides, tiny_config):
    """The trainer under torchrun's environment (2 gloo ranks, batch 25 each; tests/ranks.py) with DHKD's
    global alignment ends where one process with batch 50 does: the trainer honours ``manual_gradient_sync``
    and the method averages."""
    from ranks import run_ranks

    common = ["method.name=dhkd", "method.alignment=global", "method.alpha=4.0", "train.epochs=2",
              f"teacher.checkpoint={digits_teacher}"]
    (empty := tmp_path / "empty.yaml").write_text("{}\n")
    proc = run_ranks(["distill", "--config", str(empty), *tiny_overrides, *common, "data.batch_size=25",
                      f"run_dir={tmp_path / 'ddp'}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    single = fit(tiny_config(tmp_path / "one", *common))
    a = load_tensors(tmp_path / "ddp" / "checkpoint.safetensors")[0]
    b = load_tensors(Path(single.run_dir) / "checkpoint.safetensors")[0]
    for key in a:
        if key.startswith("method."):
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)
    assert json.loads((tmp_path / "ddp" / "metrics.jsonl").read_text().splitlines()[-1])["ranks_in_sync"] is True
