"""Bring your own data: a torch ``Dataset`` or ``DataLoader`` through ``from_torch`` into ``fit``, ``Run`` and
the analysis, the fingerprint a resume checks, and a one-line error for every kind of bad input."""

import json
import math

import numpy as np
import pytest
import torch
import yaml
from torch.utils.data import DataLoader, Dataset, IterableDataset

from kdcollapse.analysis import (AnalyzeOptions, Subject, analyze, classifier_weight, feature_pass, load_run,
                                 split_metrics)
from kdcollapse.cli import main
from kdcollapse.config import load_config
from kdcollapse.data import TensorDataset, from_torch, load_dataset, make_loader, register_dataset
from kdcollapse.data._dataset import _DATASETS
from kdcollapse.errors import CheckpointError, ConfigError, DataError
from kdcollapse.models import create_model
from kdcollapse.runs import Run, read_metrics
from kdcollapse.train import fit
from naming import raises_naming


def garments(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fashion-MNIST-like uint8 ``(n, 1, 28, 28)`` images of 10 classes: class k is a bright band at rows
    2k..2k+7 on noise, so a small MLP learns it within an epoch or two."""
    g = torch.Generator().manual_seed(seed)
    labels = torch.arange(n) % 10
    images = torch.rand(n, 1, 28, 28, generator=g) * 90
    for k in range(10):
        images[labels == k, :, 2 * k:2 * k + 8] += 150
    return images.to(torch.uint8), labels


class Garments(Dataset):
    """What a user writes: a plain map-style Dataset of ``(uint8 (1, 28, 28) image, int label)``."""

    classes = ["tee", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "boot"]

    def __init__(self, n: int, seed: int):
        self.images, self.labels = garments(n, seed)

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, i):
        return self.images[i], int(self.labels[i])


def vectors(n: int, seed: int, dim: int = 6) -> DataLoader:
    """A DataLoader of float64 numpy vectors: 3 Gaussian classes."""
    rng = np.random.default_rng(seed)
    labels = np.arange(n) % 3
    x = rng.normal(size=(n, dim)) + 4 * np.eye(3, dim)[labels]
    items = [(x[i], int(labels[i])) for i in range(n)]
    return DataLoader(items, batch_size=32)


IMAGE_RUN = ["train.progress=false", "data.batch_size=50", "schedule.name=constant", "optim.lr=0.1",
             "train.device=cpu", "model.name=mlp", "model.kwargs={input_size: 28, hidden: [32]}"]


def image_config(run_dir, *extra):
    return load_config(None, [*IMAGE_RUN, f"run_dir={run_dir}", *extra])


@pytest.fixture(scope="module")
def image_data():
    return Garments(200, seed=1), Garments(100, seed=2)


@pytest.fixture(scope="module")
def two_epochs(tmp_path_factory, image_data):
    train, test = image_data
    return fit(image_config(tmp_path_factory.mktemp("user") / "run", "train.epochs=2"), train_data=train,
               test_data=test)


def without_timing(records):
    return [{k: v for k, v in r.items() if k not in ("images_per_s", "epoch_time_s")} for r in records]


# --- the adapter -----------------------------------------------------------------------------------


def test_a_plain_dataset_becomes_a_uint8_tensor_dataset(image_data):
    train, _ = image_data
    data = from_torch(train)
    assert data.inputs.dtype == torch.uint8 and data.input_shape == (1, 28, 28) and len(data) == 200
    assert torch.equal(data.inputs, train.images) and torch.equal(data.labels, train.labels)
    assert data.classes == Garments.classes  # from the dataset's `classes` attribute
    pixels = train.images.double() / 255
    assert data.mean[0] == pytest.approx(pixels.mean().item()) and data.std[0] == pytest.approx(pixels.std().item(),
                                                                                               rel=1e-2)


def test_a_loader_of_numpy_vectors_becomes_float32_with_per_feature_statistics():
    data = from_torch(vectors(70, seed=0))
    assert data.inputs.dtype == torch.float32 and data.input_shape == (6,) and data.classes == ["0", "1", "2"]
    assert len(data.mean) == 6 and data.std[0] == pytest.approx(data.inputs[:, 0].double().std().item(), rel=0.02)
    # float images stay float, (H, W) images gain a channel, given statistics are kept
    floats = from_torch([(torch.rand(5, 5, dtype=torch.float64), k % 2) for k in range(4)], mean=(0.5,), std=(0.25,))
    assert floats.inputs.dtype == torch.float32 and floats.input_shape == (1, 5, 5) and floats.std == (0.25,)
    x, _ = next(iter(make_loader(floats, 4, train=False, device="cpu", seed=0)))
    assert torch.allclose(x, (floats.inputs - 0.5) / 0.25)


class Stream(IterableDataset):
    def __iter__(self):
        return iter([(torch.zeros(3), 1), (torch.ones(3), 0)])


@pytest.mark.parametrize("data, options, message", [
    ([(torch.zeros(3),)] * 2, {}, "item 0 is a tuple of length 1; each item must be an \\(x, y\\) pair"),
    ([torch.zeros(3)] * 2, {}, "item 0 is a Tensor; each item must be an \\(x, y\\) pair"),
    ([(torch.zeros(1, 4, 4), 0), (torch.zeros(1, 4, 5), 1)], {}, "item 0 has inputs of shape \\(1, 4, 4\\).*item 1 "
     "has \\(1, 4, 5\\).*same shape"),
    ([(torch.zeros(3), 0.0)], {}, "item 0 has torch.float(32|64) labels; labels must be integers >= 0"),
    ([(torch.zeros(3), -1)], {}, "item 0 has the label -1; labels must be integers >= 0"),
    ([(torch.zeros(3), 0), (torch.tensor([0.0, math.nan, 1.0]), 1)], {}, "sample 1 .* NaN or infinite"),
    ([], {}, "the data is empty"),
    ([(torch.zeros(3, 8, 8, dtype=torch.uint8), 0)] * 4, {"max_bytes": 500}, "need 0.00 GiB .* more than "
     "max_bytes=500 .*raise max_bytes, or keep the images in files and use an image-folder dataset"),
    ([(torch.zeros(1, 4, 4, dtype=torch.int64), 0)], {}, "torch.int64 inputs; images must be uint8"),
    ([(torch.zeros(3), 0)], {"mean": (0.0,)}, "give both mean and std"),
    ([(torch.zeros(3), 4)], {"num_classes": 3}, "labels reach 4 but there are 3 classes"),
    ([("an image", 0)], {}, "the input of item 0 is a str; give a tensor or numpy array"),
    (object(), {}, "expected a torch Dataset or DataLoader yielding \\(x, y\\) pairs, got object"),
])
def test_bad_data_is_a_one_line_data_error(data, options, message):
    with pytest.raises(DataError, match=message) as err:
        from_torch(data, **options)
    assert "\n" not in str(err.value)


def test_an_iterable_dataset_and_a_loader_without_batching():
    data = from_torch(Stream())
    assert data.labels.tolist() == [1, 0] and data.input_shape == (3,)
    assert torch.equal(from_torch(DataLoader(Stream(), batch_size=None)).inputs, data.inputs)


# --- training ----------------------------------------------------------------------------------------


def test_fit_on_a_plain_dataset_records_the_data(two_epochs, image_data):
    run_dir = two_epochs.run_dir
    records = read_metrics(run_dir)
    assert [r["epoch"] for r in records] == [1, 2] and records[-1]["test_acc"] == two_epochs.last_acc
    assert two_epochs.last_acc > 50  # 10 classes: chance is 10 %
    assert yaml.safe_load((run_dir / "config.yaml").read_text())["data"]["name"] == "user"
    recorded = json.loads((run_dir / "run.json").read_text())["user_data"]
    assert set(recorded) == {"train", "test"} and recorded["train"]["samples"] == 200
    assert recorded["test"]["input_shape"] == [1, 28, 28] and recorded["test"]["dtype"] == "uint8"
    # a reader needs the data again; with it, the run's splits are the data given
    with pytest.raises(DataError, match="trained on data passed from Python.*pass the same data again"):
        Run(run_dir).dataset("test")
    test = Run(run_dir, train_data=image_data[0], test_data=image_data[1]).dataset("test")
    assert torch.equal(test.inputs, image_data[1].images) and test.mean == from_torch(image_data[0]).mean


def test_fit_on_a_loader_of_vectors_with_a_validation_split(tmp_path):
    run = ["train.progress=false", "train.epochs=1", "data.batch_size=16", "optim.lr=0.2", "model.name=mlp",
           "model.kwargs={input_size: 1, hidden: [16]}", f"run_dir={tmp_path}"]
    splits = {"train_data": vectors(96, 0), "test_data": vectors(60, 1), "val_data": vectors(30, 2)}
    result = fit(load_config(None, run), **splits)
    (record,) = read_metrics(tmp_path)
    assert result.selected_on == "val" and "val_acc" in record and record["test_acc"] > 60
    with pytest.raises(DataError, match="give either val_data or data.val_per_class=2, not both"):
        fit(load_config(None, [*run, "data.val_per_class=2"]), overwrite=True, **splits)


def test_splits_must_agree_and_the_class_count_is_still_checked(tmp_path, image_data):
    train, test = image_data
    with raises_naming(DataError, "test_data", "3 classes", "(6,)", "train_data"):
        fit(image_config(tmp_path), train_data=train, test_data=from_torch(vectors(30, 0)))
    with pytest.raises(DataError, match="give both train_data and test_data"):
        fit(image_config(tmp_path), train_data=train)
    with pytest.raises(ConfigError, match="model.num_classes=5 does not match dataset 'user', which has 10"):
        fit(image_config(tmp_path, "model.num_classes=5"), train_data=train, test_data=test)
    assert not (tmp_path / "config.yaml").exists()


def test_resume_with_the_same_data_continues_and_other_data_is_refused(tmp_path, two_epochs, image_data, capsys):
    train, test = image_data
    run_dir = tmp_path / "run"
    fit(image_config(run_dir, "train.epochs=1"), train_data=train, test_data=test)
    with pytest.raises(CheckpointError, match="trained on other train data \\(200 samples.*given: 199 samples.*"
                                              "pass the same data again"):
        fit(image_config(run_dir, "train.epochs=2"), resume=True, train_data=torch.utils.data.Subset(train, range(199)),
            test_data=test)
    with pytest.raises(ConfigError, match="trained on data passed from Python.*not on 'fashion_mnist'.*same data"):
        fit(image_config(run_dir, "train.epochs=2"), resume=True)
    assert main(["train", "--resume", str(run_dir), "train.epochs=2"]) == 2
    assert "pass the same data again" in capsys.readouterr().err
    fit(image_config(run_dir, "train.epochs=2"), resume=True, train_data=train, test_data=test)
    assert without_timing(read_metrics(run_dir)) == without_timing(read_metrics(two_epochs.run_dir))


# --- analysis ----------------------------------------------------------------------------------------


@pytest.fixture
def registered_garments(monkeypatch):
    """The same test images registered as a dataset, fed as they are (mean 0, std 1)."""
    monkeypatch.setattr(_DATASETS, "_entries", dict(_DATASETS._entries))

    @register_dataset("garments", description="the test's Fashion-MNIST-like images")
    def load(root, split):
        images, labels = garments(100, seed=2)
        return TensorDataset(images, labels, list(Garments.classes), (0.0,), (1.0,), "garments")

    return load_dataset("garments", "test")


def test_analyze_on_a_user_dataset_equals_analyze_on_the_registered_dataset(tmp_path, image_data,
                                                                            registered_garments):
    torch.manual_seed(0)
    model = create_model("mlp", 10, in_channels=1, input_size=28, hidden=[24]).eval()
    options = AnalyzeOptions(progress=False)  # batches of 512, as feature_pass batches a dataset
    mine = analyze(Subject(model, image_data[1], "test"), tmp_path / "mine", options)
    theirs = analyze(Subject(model, registered_garments, "test"), tmp_path / "theirs", options)
    for key in ("metrics", "margins", "spectra", "num_samples"):
        assert mine[key] == theirs[key], key
    # a DataLoader given straight to feature_pass: the same pass (its own batch size does not matter)
    passed = feature_pass(model, DataLoader(image_data[1], batch_size=30), num_classes=10)
    assert split_metrics(passed, classifier_weight(model)) == mine["metrics"]


def test_a_user_data_run_is_analysed_with_its_training_normalisation(two_epochs, image_data, tmp_path):
    run = Run(two_epochs.run_dir, train_data=image_data[0], test_data=image_data[1])
    report = analyze(load_run(run, "test", device=torch.device("cpu")), tmp_path, AnalyzeOptions(progress=False))
    assert report["dataset"] == "user" and 100 * report["metrics"]["accuracy"] == pytest.approx(two_epochs.last_acc)


def test_a_loaded_model_on_a_plain_dataset_gets_its_training_normalisation(two_epochs, image_data, tmp_path,
                                                                          registered_garments):
    """Issue 28: ``analyze(Subject(model, my_dataset))`` used to skip the normalisation and report a wrong
    accuracy. A model loaded by kdcollapse keeps its (mean, std); a dataset standardised otherwise is refused."""
    from kdcollapse.errors import KdcollapseError
    from kdcollapse.runs import load_model

    model, meta = load_model(two_epochs.run_dir)
    assert model.input_normalization == (tuple(meta["mean"]), tuple(meta["std"])) != ((0.0,), (1.0,))
    report = analyze(Subject(model, image_data[1], "test"), tmp_path, AnalyzeOptions(progress=False))
    assert 100 * report["metrics"]["accuracy"] == pytest.approx(two_epochs.last_acc)
    with pytest.raises(KdcollapseError, match=r"trained on inputs standardised with mean .* but dataset 'garments' "
                                              r"applies mean \[0.0\], std \[1.0\]"):
        Subject(model, registered_garments, "test")
