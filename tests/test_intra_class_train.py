"""Two augmented views from the loader, and the intra-class teacher, RKD and KD+RKD in the real trainer
(digits, tiny MLPs): pinned first losses, exact resume with a non-empty cache."""

import importlib.util
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.config import load_config
from kdcollapse.data import Augment, TensorDataset, augment_batch, make_loader
from kdcollapse.errors import DataError
from kdcollapse.losses import kd_loss, rkd_loss
from kdcollapse.train import Trainer, fit
from kdcollapse.runs import load_tensors, read_metrics


def images(n: int = 24, classes: int = 3, size: int = 6) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    return TensorDataset(inputs, torch.arange(n) % classes, [str(c) for c in range(classes)],
                         (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), "tiny")


def epoch_of(loader, epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
    loader.set_epoch(epoch)
    batches = list(loader)
    return torch.cat([x for x, _ in batches]), torch.cat([y for _, y in batches])


# --- views -----------------------------------------------------------------------------------------


def test_second_view_is_independent_deterministic_and_leaves_the_first_unchanged():
    ds = images()
    make = lambda views, seed=0: make_loader(ds, 8, train=True, device="cpu", seed=seed,  # noqa: E731
                                             augment=Augment(2, True), views=views)
    single_x, single_y = epoch_of(make(1), 3)
    x, y = epoch_of(make(2), 3)
    assert x.shape == (24, 2, 3, 6, 6) and single_x.shape == (24, 3, 6, 6)
    assert torch.equal(x[:, 0], single_x) and torch.equal(y, single_y)  # the single-view batches, bit for bit
    differs = (x[:, 0] != x[:, 1]).flatten(1).any(1)
    assert differs.float().mean() > 0.8  # 25 crops x 2 flips: a second draw rarely repeats the first
    again, _ = epoch_of(make(2), 3)
    assert torch.equal(x, again)  # a function of (seed, epoch)
    assert not torch.equal(x[:, 1], epoch_of(make(2), 4)[0][:, 1])
    assert not torch.equal(x[:, 1], epoch_of(make(2, seed=1), 3)[0][:, 1])
    # The second view is the documented augmentation with the plan's extra draws.
    loader = make(2)
    loader.set_epoch(3)
    plan = loader._plan(torch.device("cpu"))
    raw = ds.inputs[plan["index"]]
    expected = augment_batch(raw, plan["extra_offsets"][:, 0], plan["extra_flips"][:, 0], 2)
    mean, std = torch.tensor(ds.mean).view(1, 3, 1, 1), torch.tensor(ds.std).view(1, 3, 1, 1)
    torch.testing.assert_close(x[:, 1], (expected.float() / 255 - mean) / std)
    assert set(plan) == {"index", "offsets", "flips", "extra_offsets", "extra_flips"}
    assert set(make(1)._plan(torch.device("cpu"))) == {"index", "offsets", "flips"}


def test_views_need_training_with_augmentation():
    ds = images()
    with pytest.raises(DataError, match="views must be an int >= 1"):
        make_loader(ds, 8, train=True, device="cpu", seed=0, views=0)
    with pytest.raises(DataError, match="views=2 asks for independently augmented views.*crop_padding > 0"):
        make_loader(ds, 8, train=True, device="cpu", seed=0, augment=Augment(), views=2)
    with pytest.raises(DataError, match="views=2 asks for independently augmented views.*train=True"):
        make_loader(ds, 8, train=False, device="cpu", seed=0, views=2)


def test_views_of_decoded_folder_images(tmp_path):
    from PIL import Image

    from kdcollapse.data import FolderDataset

    samples = []
    for i in range(6):
        path = tmp_path / f"{i}.png"
        Image.fromarray(torch.randint(0, 256, (8, 8, 3), dtype=torch.uint8).numpy()).save(path)
        samples.append((str(path), i % 2))
    ds = FolderDataset(samples, ["a", "b"], (0.5,) * 3, (0.25,) * 3, "folder", image_size=8, resize=8)
    make = lambda views: make_loader(ds, 3, train=True, device="cpu", seed=0,  # noqa: E731
                                     augment=Augment(1, True), num_workers=0, views=views)
    single, double = epoch_of(make(1), 1)[0], epoch_of(make(2), 1)[0]
    assert double.shape == (6, 2, 3, 8, 8) and torch.equal(double[:, 0], single)
    assert not torch.equal(double[:, 0], double[:, 1])
    with pytest.raises(DataError, match="views > 1 is not supported with random-resized crops"):
        make_loader(replace(ds, random_resized_crop=True), 3, train=True, device="cpu", seed=0,
                    augment=Augment(flip=True), num_workers=0, views=2)


# --- methods in the trainer --------------------------------------------------------------------------

# How these runs differ from the tiny run (conftest.py): 12 images per class, 2 steps of 64 and 56 images
# per epoch, crops.
RUN = ["data.batch_size=64", "data.train_per_class=12", "data.test_per_class=5", "data.crop_padding=1"]
TEACHER = [*RUN, "model.kwargs={input_size: 8, hidden: [32]}", "method.name=intra_class_teacher",
           "method.margin_threshold=-1.0", "method.cache_min_count=20", "method.cache_capacity=32"]
STUDENT = RUN  # the tiny run's hidden layer of 16: feature dim 16, the teacher's is 32


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory, tiny_config):
    return fit(tiny_config(tmp_path_factory.mktemp("teacher"), *TEACHER, "train.epochs=1")).run_dir


def test_teacher_trains_with_pinned_first_loss(teacher_run):
    (record,) = read_metrics(teacher_run)
    # Regression pin of the first epoch (2 steps). With 12 images of each class seen and a minimum
    # count of 20, no pipeline is used yet: the loss is CE and the caches hold every gated image.
    assert record["train_loss"] == pytest.approx(2.318270, abs=1e-5)
    assert record["train_intra"] == 0 and record["gate_fraction"] == 1.0
    assert record["cache_fill"] == pytest.approx(120 / (10 * 20))
    tensors, _ = load_tensors(Path(teacher_run) / "checkpoint.safetensors")
    assert tensors["extra.cache_labels"].bincount().tolist() == [12] * 10
    assert tensors["extra.cache_anchors"].shape == (120, 32)


@pytest.mark.parametrize("method, pinned", [("rkd", 4.670581), ("kd_rkd", 2.594583)])
def test_rkd_students_first_step_and_pinned_loss(tmp_path, tiny_config, teacher_run, method, pinned):
    cfg = tiny_config(tmp_path / method, *STUDENT, f"method.name={method}", f"teacher.checkpoint={teacher_run}",
                      "train.epochs=1")
    trainer = Trainer(cfg)
    trainer.train_loader.set_epoch(0)
    x, y = next(iter(trainer.train_loader))
    out = trainer.method(x, y)
    student, teacher_model = trainer.method.student, trainer.method.teacher.model
    h_s, h_t = student.forward_features(x), teacher_model.forward_features(x)
    assert h_s.shape[1] == 16 and h_t.shape[1] == 32  # RKD compares relations, no projection needed
    z_s, z_t = student.forward_head(h_s), teacher_model.forward_head(h_t)
    expected = rkd_loss(h_s, h_t) + (1.0 * F.cross_entropy(z_s, y) if method == "rkd" else
                                     0.1 * F.cross_entropy(z_s, y) + 0.9 * kd_loss(z_s, z_t, temperature=1.0))
    torch.testing.assert_close(out["loss"], expected)
    assert sum(v for k, v in out.items() if k not in ("loss", "logits")).item() == pytest.approx(out["loss"].item())
    trainer.run()
    (record,) = read_metrics(cfg.run_dir)
    assert record["train_loss"] == pytest.approx(pinned, abs=1e-5)


def test_resume_with_a_non_empty_cache_is_exact(tmp_path, tiny_config):
    # The cache persists across epochs (it is method extra_state): with a minimum count of 20 and 12
    # images per class per epoch, epoch 1 ends with 12 cached per class, and epoch 2 uses them.
    straight = fit(tiny_config(tmp_path / "straight", *TEACHER, "train.epochs=3"))
    fit(tiny_config(tmp_path / "split", *TEACHER, "train.epochs=1"))
    split_state, _ = load_tensors(tmp_path / "split" / "checkpoint.safetensors")
    assert len(split_state["extra.cache_labels"]) == 120
    resumed = fit(load_config(tmp_path / "split" / "config.yaml", ["train.epochs=3"]), resume=True)
    a, _ = load_tensors(Path(straight.run_dir) / "checkpoint.safetensors")
    b, _ = load_tensors(Path(resumed.run_dir) / "checkpoint.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    records = read_metrics(resumed.run_dir)
    assert [r["epoch"] for r in records] == [1, 2, 3]
    assert records[1]["train_intra"] > 0 and records[1] == read_metrics(straight.run_dir)[1] | {
        k: records[1][k] for k in ("images_per_s", "epoch_time_s")}


# --- recipes -----------------------------------------------------------------------------------------


def test_recipes_are_generated_load_and_name_their_teacher():
    configs = Path(__file__).resolve().parents[1] / "configs" / "intra_class"
    spec = importlib.util.spec_from_file_location("generate_intra_class", configs / "generate.py")
    generator = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = generator  # dataclasses look their module up there
    spec.loader.exec_module(generator)
    generated = generator.recipes()
    committed = {p for p in configs.rglob("*.yaml") if p.parent.name != "fashion_mnist"}
    assert committed == set(generated) and len(generated) == 3 * (3 + 6 * 2)
    assert all(path.read_text() == text for path, text in generated.items()), "run configs/intra_class/generate.py"
    for path in [*generated, *configs.glob("fashion_mnist/*.yaml")]:
        cfg = load_config(path)
        if cfg.method.name == "intra_class_teacher":
            assert (cfg.data.crop_padding or cfg.data.flip) and 0 < cfg.method.intra_weight <= 0.03
            continue
        assert cfg.method.name in ("kd", "kd_rkd") and (cfg.method.ce_weight, cfg.method.kd_weight) == (0.1, 0.9)
        if path.parent.name != "fashion_mnist":
            model = Path(cfg.teacher.checkpoint).name.removeprefix("teacher_")
            teacher = load_config(path.parent / f"teacher_{model}.yaml")
            assert teacher.run_dir == cfg.teacher.checkpoint and teacher.data.name == cfg.data.name
            assert "in the paper's Table" in path.read_text().splitlines()[0]  # names the paper's number


def test_rkd_config_errors():
    from kdcollapse.config import method_config
    from kdcollapse.errors import ConfigError

    with pytest.raises(ConfigError, match="method.angle_weight must be >= 0, got -1"):
        method_config({"name": "rkd", "angle_weight": -1})
    with pytest.raises(ConfigError, match="method.temperature must be > 0, got 0"):
        method_config({"name": "kd_rkd", "temperature": 0})
