"""The crd, reviewkd and vid methods: one step against the official computation, CRD's memory bank (sampler,
update, global under DDP, checkpoint, absent from the model file) and the configs' errors.

The official step of CRD transcribes megvii-research/mdistiller at commit
a08d46f10d6102bd6e3f258ca5ac880b020ea259, ``mdistiller/distillers/CRD.py`` (Embed, ContrastMemory.forward,
ContrastLoss, CRD.forward_train); the loss parts are those of tests/test_losses_contrastive_features.py.
"""

import os
from pathlib import Path

import pytest
from ranks import free_port
import torch
import torch.multiprocessing as mp
import torch.nn.functional as F
from test_losses_contrastive_features import (official_contrast_loss, official_contrast_scores, official_hcl,
                                              official_memory_update)

from kdcollapse.config import method_config
from kdcollapse.distributed import distributed_teardown
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.methods import FrozenTeacher, build_method
from kdcollapse.models import create_model

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
K, N = 10, 40  # classes, training-set size
LABELS = torch.arange(N) % K  # the training set's labels


def make(name, labels=LABELS, **options):
    torch.manual_seed(0)
    student = create_model("convnet_small", K, in_channels=1)
    teacher = FrozenTeacher(create_model("convnet_small", K, in_channels=1))
    return build_method(method_config({"name": name, **options}), student, num_classes=K, teacher=teacher,
                        train_labels=labels)


def batch(b=8, seed=0):
    """(x, y, index): ``b`` random training rows and their labels."""
    g = torch.Generator().manual_seed(seed)
    index = torch.randperm(N, generator=g)[:b]
    return torch.randn(b, 1, 8, 8, generator=g), LABELS[index], index


# ------------------------------------------------------------------------------------------- CRD
def test_crd_step_equals_the_official_computation(monkeypatch):
    m = make("crd", num_negatives=6).double()
    m.teacher.model.double()
    x, y, index = batch()
    x = x.double()
    m.train()
    idx = torch.randint(N, (len(y), 6))
    monkeypatch.setattr(m, "sample_negatives", lambda labels: idx)
    memory_s, memory_t = m.memory_student.clone(), m.memory_teacher.clone()
    out = m(x, y, index=index)
    # The official step on the same embeddings, memory and contrast indices (positive first).
    h_s = m.student.forward_features(x)
    h_t = m.teacher.model.forward_features(x).detach().float().double()  # the teacher answers in float32
    v1 = F.normalize(m.embed_student.linear(h_s), dim=1)  # Embed: linear + x / ||x||
    v2 = F.normalize(m.embed_teacher.linear(h_t), dim=1)
    contrast_idx = torch.cat([index[:, None], idx], 1)
    out_v2 = official_contrast_scores(memory_s, v2, contrast_idx, 0.07, 1.0)
    out_v1 = official_contrast_scores(memory_t, v1, contrast_idx, 0.07, 1.0)
    z_v1, z_v2 = out_v1.mean().item() * N, out_v2.mean().item() * N
    torch.testing.assert_close(m.normalizers, torch.tensor([z_v1, z_v2], dtype=torch.float64))
    expected = 0.8 * (official_contrast_loss(out_v1 / z_v1, N) + official_contrast_loss(out_v2 / z_v2, N)).squeeze()
    torch.testing.assert_close(out["crd"], expected.detach(), rtol=1e-9, atol=1e-9)
    torch.testing.assert_close(m.memory_student, official_memory_update(memory_s, v1.detach(), index, 0.5))
    torch.testing.assert_close(m.memory_teacher, official_memory_update(memory_t, v2.detach(), index, 0.5))
    g_ours = torch.autograd.grad(out["loss"], [m.embed_student.linear.weight, m.embed_teacher.linear.weight])
    ce = F.cross_entropy(m.student.forward_head(h_s), y)
    g_official = torch.autograd.grad(ce + expected, [m.embed_student.linear.weight, m.embed_teacher.linear.weight])
    for a, b in zip(g_ours, g_official):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


# Unbalanced labels: class 0 has 20 samples, classes 1..9 two or three each (37 or 38 others).
UNBALANCED = torch.cat([torch.zeros(20, dtype=torch.long), torch.arange(20) % 9 + 1])


@pytest.mark.parametrize("replacement", [False, True])
def test_crd_negatives_are_other_classes_from_the_first_step(replacement):
    """Drawn from the labels given at construction (mdistiller's cls_negative lists), before any step: never
    the row's class, a function of the seed, a K-subset unless the row's class leaves fewer than K others
    (class 0 here: 20 others < 25) or ``replacement`` is set, as the official sampler decides per sample."""
    m = make("crd", UNBALANCED, num_negatives=25, replacement=replacement)
    y = torch.tensor([0, 3, 3, 9, 0])
    torch.manual_seed(5)
    first = m.sample_negatives(y)
    torch.manual_seed(5)
    assert torch.equal(first, m.sample_negatives(y))
    assert first.shape == (5, 25)
    assert (UNBALANCED[first] != y[:, None]).all()
    repeats = [len(set(row.tolist())) < 25 for row in first]
    assert repeats[0] and repeats[4]  # 20 candidates for 25 draws
    if not replacement:
        assert not any(repeats[1:4])


@pytest.mark.parametrize("replacement", [False, True])
def test_crd_negatives_are_uniform_over_the_other_classes(replacement):
    """Every other-class sample is drawn equally often (4,000 draws of each of 37 or 38 candidates here): no
    sample of the class block is skipped or doubled by the position-to-index map."""
    m = make("crd", UNBALANCED, num_negatives=10, replacement=replacement)
    torch.manual_seed(0)
    for c in (0, 1, 9):
        counts = torch.bincount(m.sample_negatives(torch.full((15_000,), c)).flatten(), minlength=N).double()
        others = UNBALANCED != c
        assert (counts[~others] == 0).all()
        expected = 150_000 / int(others.sum())
        assert ((counts[others] - expected).abs() < 0.08 * expected).all(), (c, counts)


def test_crd_relax_positives_are_uniform_over_the_own_class():
    m = make("crd", UNBALANCED, num_negatives=6, mode="relax")
    torch.manual_seed(0)
    for c, size in ((0, 20), (4, 2)):
        drawn = m.sample_positives(torch.full((20_000,), c))
        counts = torch.bincount(drawn, minlength=N).double()
        assert (UNBALANCED[drawn] == c).all()
        assert ((counts[UNBALANCED == c] - 20_000 / size).abs() < 0.1 * 20_000 / size).all()


@pytest.mark.parametrize("mode", ["exact", "relax"])
def test_crd_first_epoch_of_a_run_draws_no_same_class_negative(mode, tmp_path, digits_conv_teacher, monkeypatch):
    """Through the trainer: the rows drawn at every step of the first epoch, checked against the labels the
    batches themselves carry (the whole training set is seen once, so every drawn row's label is known).
    The positive is the sample's own row (exact) or one of its class (relax)."""
    from kdcollapse.cli import main
    from kdcollapse.methods import get_method

    crd, seen, drawn = get_method("crd"), {}, []
    forward, log_scores = crd.forward, crd.log_scores

    def record_forward(self, x, y, *, index):
        seen.update(zip(index.tolist(), y.tolist()))
        drawn.append((y, index))
        return forward(self, x, y, index=index)

    def record_scores(self, anchors, memory, idx):
        if memory is self.memory_teacher:
            drawn[-1] += (idx,)
        return log_scores(self, anchors, memory, idx)

    monkeypatch.setattr(crd, "forward", record_forward)
    monkeypatch.setattr(crd, "log_scores", record_scores)
    overrides = ["method.num_negatives=12", f"method.mode={mode}", "data.name=digits", "schedule.warmup_epochs=0",
                 "data.train_per_class=3", "data.batch_size=10", "data.test_per_class=1", "model.name=convnet_small",
                 "model.kwargs={}", "train.epochs=1", "train.progress=false", f"run_dir={tmp_path / 'crd'}",
                 f"teacher.checkpoint={digits_conv_teacher}"]
    assert main(["distill", "--config", str(CONFIGS / "fashion_mnist" / "crd.yaml"), *overrides]) == 0
    steps = [d for d in drawn if len(d) == 3][-3:]  # the run's 3 steps (the probe's comes first)
    assert len(steps) == 3 and len(seen) == 30
    label = torch.tensor([seen[i] for i in range(30)])
    for y, index, idx in steps:
        assert (label[idx[:, 1:]] != y[:, None]).all()  # 12 negatives of other classes, from the first step on
        assert torch.equal(label[idx[:, 0]], y)
        if mode == "exact":
            assert torch.equal(idx[:, 0], index)


def test_crd_nan_inputs_are_named_and_leave_the_bank_alone():
    m = make("crd", num_negatives=6).train()
    x, y, index = batch()
    x[3, 0] = float("nan")
    state = {k: v.clone() for k, v in m.state_dict().items() if not k.startswith("student")}
    with pytest.raises(KdcollapseError, match="contains NaN or inf"):
        m(x, y, index=index)
    for key in ("memory_student", "memory_teacher", "normalizers"):
        assert torch.equal(m.state_dict()[key], state[key]), key


def test_crd_config_errors():
    for missing in ({}, {"num_samples": N}):
        with pytest.raises(ConfigError, match="train_labels"):
            build_method(method_config({"name": "crd"}), create_model("convnet_small", K, in_channels=1),
                         num_classes=K, teacher=FrozenTeacher(create_model("convnet_small", K, in_channels=1)), **missing)
    with pytest.raises(KdcollapseError, match="train_labels has 40 entries but num_samples=41"):
        build_method(method_config({"name": "crd"}), create_model("convnet_small", K, in_channels=1), num_classes=K,
                     teacher=FrozenTeacher(create_model("convnet_small", K, in_channels=1)), train_labels=LABELS,
                     num_samples=41)
    with pytest.raises(KdcollapseError, match=r"train_labels must lie in \[0, 10\), got range \[0, 10\]"):
        make("crd", torch.arange(11))
    with pytest.raises(ConfigError, match="one class"):
        make("crd", torch.zeros(N, dtype=torch.long))
    with pytest.raises(ConfigError, match="method.mode must be one of exact, relax, got 'loose'"):
        method_config({"name": "crd", "mode": "loose"})
    x, y, index = batch()
    with pytest.raises(KdcollapseError, match="labels differ from train_labels"):
        make("crd", num_negatives=6).train()(x, (y + 1) % K, index=index)
    with pytest.raises(ConfigError, match="method.momentum"):
        method_config({"name": "crd", "momentum": 1.5})


def _crd_worker(rank, port, out_dir):
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    with distributed_teardown():
        m = make("crd", num_negatives=6).eval()  # eval: batch-norm statistics do not depend on the split
        x, y, index = batch()
        half = slice(4 * rank, 4 * rank + 4)
        m(x[half], y[half], index=index[half])
        torch.save({k: v for k, v in m.state_dict().items() if not k.startswith("student")},
                   Path(out_dir) / f"rank{rank}.pt")


@pytest.mark.slow
def test_crd_memory_bank_is_global_under_ddp(tmp_path):
    """Two gloo ranks with 4 samples each update both banks as one process does with the 8: every row of the
    global batch, on every rank; the first-step constants agree across ranks."""
    mp.start_processes(_crd_worker, args=(free_port(), str(tmp_path)), nprocs=2, start_method="fork")
    ranks = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    m = make("crd", num_negatives=6).eval()
    x, y, index = batch()
    m(x, y, index=index)
    for r in ranks:
        for key in ("memory_student", "memory_teacher"):
            torch.testing.assert_close(r[key], m.state_dict()[key], rtol=1e-5, atol=1e-6)
    assert torch.equal(ranks[0]["normalizers"], ranks[1]["normalizers"])


# -------------------------------------------------------------------------------------- ReviewKD
def test_reviewkd_step_is_the_official_hcl_of_its_fusion():
    m = make("reviewkd", warmup_epochs=20, reviewkd_weight=5.0)
    x, y, _ = batch()
    m.train()
    m.on_epoch_start(3)  # epoch 4 of 20: weight 4/20
    out = m(x, y)
    h, maps = m.student.forward_intermediates(x, [1, 2, 3])
    fused = m.fusion([*maps, h[:, :, None, None]], [4, 2, 1, 1])
    t_h, t_maps = m.teacher.model.forward_intermediates(x, [1, 2, 3], pre_act=True)
    expected = 5.0 * 4 / 20 * official_hcl(fused, [*t_maps, t_h[:, :, None, None]])
    torch.testing.assert_close(out["reviewkd"], expected.detach(), rtol=1e-5, atol=1e-6)
    assert not any(k.startswith("fusion") for k in m.inference_model().state_dict())
    assert any(k.startswith("fusion") for k in m.state_dict())


def test_reviewkd_fuses_non_square_maps_to_the_teachers_shapes():
    """fashion_mnist_pairs' 28×56 images: each fused map has its teacher map's (H, W), and a map whose width
    equals its target's but not its height is still resized (the official code compares widths only)."""
    m = make("reviewkd", warmup_epochs=0)
    x, y = torch.randn(4, 1, 28, 56), torch.arange(4)
    m.train()
    out = m(x, y)
    h, maps = m.student.forward_intermediates(x, [1, 2, 3])
    t_h, t_maps = m.teacher.model.forward_intermediates(x, [1, 2, 3], pre_act=True)
    targets = [*t_maps, t_h[:, :, None, None]]
    fused = m.fusion([*maps, h[:, :, None, None]], [tuple(t.shape[-2:]) for t in targets])
    assert [f.shape for f in fused] == [t.shape for t in targets] and targets[0].shape[-2] != targets[0].shape[-1]
    torch.testing.assert_close(out["reviewkd"], official_hcl(fused, targets).detach(), rtol=1e-5, atol=1e-6)
    block = m.fusion.blocks[0]  # the deepest (no fusion): a (H, W) target differing in height only
    z = torch.randn(2, block.conv1[0].in_channels, 6, 8)
    assert block(z, out_shape=(4, 8))[1].shape[-2:] == (4, 8)


def test_reviewkd_and_vid_reject_missing_stages():
    for name in ("reviewkd", "vid"):
        with pytest.raises(ConfigError, match="student_stages: stage.*7.* not offered by the student"):
            make(name, student_stages=[1, 7], teacher_stages=[1, 2])
        with pytest.raises(ConfigError, match="pair the stages one to one"):
            make(name, student_stages=[1, 2], teacher_stages=[1, 2, 3])


# ------------------------------------------------------------------------------------------- VID
@pytest.mark.parametrize("learn_variance", [True, False])
def test_vid_step_and_its_variance(learn_variance):
    m = make("vid", learn_variance=learn_variance)
    x, y, _ = batch()
    m.train()
    out = m(x, y)
    out["loss"].backward()
    grads = [a.grad for a in m.log_scales]
    assert all((g is not None) == learn_variance for g in grads)
    variance = F.softplus(m.log_scales[0]) + 1e-5
    torch.testing.assert_close(variance, torch.full_like(variance, 5.0))
    assert all(p.grad is not None for p in m.regressors.parameters())
    assert not any(k.startswith(("regressors", "log_scales")) for k in m.inference_model().state_dict())


# ----------------------------------------------------------------------------- the Fashion-MNIST recipes
# First two training losses (one step per epoch) of each recipe on 30 digits images with convnet_small
# student and teacher; deterministic given the seed. Change them only for an intended change of the maths.
PINNED = {"crd": [18.18604278564453, 18.00678825378418], "reviewkd": [6.160299301147461, 5.885436058044434],
          "vid": [4.777981758117676, 4.679056167602539]}


@pytest.mark.parametrize("stem", sorted(PINNED))
def test_fashion_mnist_recipe_trains_with_pinned_losses(stem, tmp_path, digits_conv_teacher):
    import json

    from kdcollapse.cli import main

    overrides = ["data.name=digits", "data.train_per_class=3", "data.batch_size=30", "data.test_per_class=2",
                 "model.name=convnet_small", "model.kwargs={}", "schedule.warmup_epochs=0", "train.epochs=2",
                 "train.progress=false", f"run_dir={tmp_path / stem}", f"teacher.checkpoint={digits_conv_teacher}"]
    assert main(["distill", "--config", str(CONFIGS / "fashion_mnist" / f"{stem}.yaml"), *overrides]) == 0
    records = [json.loads(line) for line in (tmp_path / stem / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in records]
    assert losses == pytest.approx(PINNED[stem], rel=1e-5), losses
