"""kdcollapse.data: real formats (IDX, CIFAR pickles, image folders), the loader and its augmentation."""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import FASHION_MNIST_DIR, requires_fashion_mnist
from formats import (
    idx_bytes,
    py2_pickle,
    write_cifar,
    write_idx_files,
    write_imagenet,
    write_jpeg,
    write_tiny_imagenet,
)

from kdcollapse.data import (
    Augment,
    FolderDataset,
    TensorDataset,
    augment_batch,
    list_datasets,
    load_dataset,
    make_loader,
    search_paths,
)
from kdcollapse.data._cifar import restricted_loads
from kdcollapse.data._folder import random_resized_crop, resize_center_crop
from kdcollapse.data._idx import read_idx
from kdcollapse.errors import DataError

# --- registry and search ---------------------------------------------------------------------------


def test_registry_lists_every_dataset():
    expected = {"fashion_mnist", "fashion_mnist_pairs", "mnist", "cifar10", "cifar100", "imagenet", "tiny_imagenet",
                "image_folder", "digits", "gaussian_mixture"}  # fmt: skip
    assert set(list_datasets()) == expected
    assert list_datasets("cifar*") == ["cifar10", "cifar100"]


# Every registered dataset: built in, or files this test writes in the official format (at `root`).
BUILT_IN = {"digits", "gaussian_mixture"}
WRITERS = {
    "mnist": write_idx_files,
    "fashion_mnist": write_idx_files,
    "cifar10": lambda root: write_cifar(root, hundred=False, packed=True),
    "cifar100": lambda root: write_cifar(root, hundred=True, packed=False),
    "tiny_imagenet": write_tiny_imagenet,
    "imagenet": write_imagenet,
    "image_folder": write_imagenet,  # any train/ + val/ class folders
    "fashion_mnist_pairs": write_idx_files,  # built from the Fashion-MNIST files
}
# What the "not found" error must say, where it is not `kdcollapse data download <name>`.
HOW_TO_GET = {"image_folder": "needs root=DIR",  # the user's own folders: the message names the layout
              "fashion_mnist_pairs": "kdcollapse data download fashion_mnist"}


@pytest.mark.parametrize("name", list_datasets())
def test_every_dataset_loads_or_says_how_to_get_it(name, tmp_path):
    """Built-in data loads anywhere; a file-based dataset whose files are absent raises a DataError saying
    how to get them, and loads both splits from small files in its official format."""
    assert name in BUILT_IN | set(WRITERS), f"add {name!r} to this test: BUILT_IN or a writer of its format"
    if name in BUILT_IN:
        splits = {split: load_dataset(name, split) for split in ("train", "test")}
    else:
        (empty := tmp_path / "empty").mkdir()
        how = HOW_TO_GET.get(name, "kdcollapse data download " + name)  # the download, or why there is none
        with pytest.raises(DataError, match=how):
            load_dataset(name, "train", root=None if name == "image_folder" else empty)
        WRITERS[name](tmp_path / "files")
        splits = {split: load_dataset(name, split, root=tmp_path / "files") for split in ("train", "test")}
    for split, data in splits.items():
        assert len(data) > 0 and data.labels.min() >= 0 and data.labels.max() < data.num_classes, split
        assert len(data.classes) == data.num_classes and len(data.mean) == len(data.std), split
    assert splits["train"].classes == splits["test"].classes


def test_unknown_dataset_lists_valid_names():
    with pytest.raises(DataError, match="unknown dataset 'cifar'.*Did you mean 'cifar10'.*Valid choices: .*mnist"):
        load_dataset("cifar", "train")


def test_unknown_split_and_option():
    with pytest.raises(DataError, match="unknown split 'val'.*test, train"):
        load_dataset("digits", "val")
    with pytest.raises(DataError, match="unknown option of dataset 'gaussian_mixture' 'dims'.*Did you mean 'dim'"):
        load_dataset("gaussian_mixture", "train", dims=3)


def test_missing_dataset_names_every_place_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("KDCOLLAPSE_DATA", str(tmp_path / "env"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as err:
        load_dataset("cifar10", "train")
    message = str(err.value)
    for place in search_paths("cifar10"):
        assert str(place) in message
    assert str(tmp_path / "env" / "cifar10") in message and "home/.cache/kdcollapse/cifar10" in message
    assert "kdcollapse data download cifar10" in message
    assert search_paths("fashion_mnist")[-1] == Path(FASHION_MNIST_DIR)
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        load_dataset("fashion_mnist", "train", root=tmp_path)


def test_search_order_prefers_environment_then_cwd(tmp_path, monkeypatch):
    write_idx_files(tmp_path / "env" / "mnist", n_train=10)
    write_idx_files(tmp_path / "data" / "mnist", n_train=20)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("KDCOLLAPSE_DATA", str(tmp_path / "env"))
    assert len(load_dataset("mnist", "train")) == 10
    monkeypatch.delenv("KDCOLLAPSE_DATA")
    assert len(load_dataset("mnist", "train")) == 20


# --- IDX -------------------------------------------------------------------------------------------


@requires_fashion_mnist
def test_real_fashion_mnist():
    train, test = load_dataset("fashion_mnist", "train"), load_dataset("fashion_mnist", "test")
    assert train.inputs.shape == (60000, 1, 28, 28) and train.inputs.dtype == torch.uint8
    assert test.inputs.shape == (10000, 1, 28, 28)
    assert train.labels.bincount().tolist() == [6000] * 10 and test.labels.bincount().tolist() == [1000] * 10
    assert train.classes[0] == "T-shirt/top" and train.classes[9] == "Ankle boot"
    assert (train.num_classes, train.input_shape, train.in_channels) == (10, (1, 28, 28), 1)
    # The stored mean/std are the train-set pixel statistics (from the histogram of the 47M pixels).
    counts = torch.bincount(train.inputs.flatten(), minlength=256).double()
    values = torch.arange(256, dtype=torch.float64) / 255
    mean = (counts * values).sum() / counts.sum()
    std = ((counts * (values - mean) ** 2).sum() / counts.sum()).sqrt()
    assert (mean.item(), std.item()) == pytest.approx((train.mean[0], train.std[0]), abs=5e-4)


@pytest.mark.parametrize("compress", [True, False])
def test_idx_round_trip(tmp_path, compress):
    arrays = write_idx_files(tmp_path, compress=compress)
    ds = load_dataset("mnist", "test", root=tmp_path)
    images, labels = arrays["t10k"]
    assert torch.equal(ds.inputs[:, 0], torch.from_numpy(images))
    assert torch.equal(ds.labels, torch.from_numpy(labels).long())
    assert ds.mean == (0.1307,) and ds.std == (0.3081,)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b"\x08\x00" + b[2:], "not an IDX file"),
        (lambda b: b[:2] + b"\x07" + b[3:], "unknown IDX type code 0x07"),
        (lambda b: b[:10], "truncated header"),
        (lambda b: b[:-5], r"truncated: 15691 bytes, but the header \(20, 28, 28\) implies 15696"),
        (lambda b: b + b"\x00", "has trailing bytes"),
    ],
)
def test_idx_corruption_is_named(tmp_path, damage, message):
    write_idx_files(tmp_path, compress=False)
    path = tmp_path / "t10k-images-idx3-ubyte"
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(DataError, match=message) as err:
        load_dataset("mnist", "test", root=tmp_path)
    assert str(path) in str(err.value)


def test_idx_broken_gzip_and_count_mismatch(tmp_path):
    write_idx_files(tmp_path)
    path = tmp_path / "t10k-images-idx3-ubyte.gz"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match=f"{path}: cannot read \\(EOFError"):
        read_idx(path)
    path.write_bytes(b"\x1f\x8b" + b"garbage" * 10)
    with pytest.raises(DataError, match=f"{path}: cannot read"):
        read_idx(path)
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((19, 28, 28), np.uint8))))
    with pytest.raises(DataError, match="has 19 images but .* has 20 labels"):
        load_dataset("mnist", "test", root=tmp_path)
    path.write_bytes(gzip.compress(idx_bytes(np.zeros((20, 28, 27), np.uint8))))
    with pytest.raises(DataError, match=r"expected uint8 images of shape \(N, 28, 28\)"):
        load_dataset("mnist", "test", root=tmp_path)


# --- CIFAR -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("hundred", [False, True], ids=["cifar10", "cifar100"])
@pytest.mark.parametrize("layout", ["packed", "extracted", "folder_as_root"])
def test_cifar_official_format(tmp_path, hundred, layout):
    members = write_cifar(tmp_path, hundred, packed=layout == "packed")
    name = "cifar100" if hundred else "cifar10"
    root = tmp_path / ("cifar-100-python" if hundred else "cifar-10-batches-py") if layout == "folder_as_root" else tmp_path
    train, test = load_dataset(name, "train", root=root), load_dataset(name, "test", root=root)
    label_key = "fine_labels" if hundred else "labels"
    train_batches = ["train"] if hundred else [f"data_batch_{i}" for i in range(1, 6)]
    data = np.concatenate([members[b]["data"] for b in train_batches])
    labels = sum((members[b][label_key] for b in train_batches), [])
    assert train.inputs.shape == (30, 3, 32, 32) and len(test) == 7
    assert train.labels.tolist() == labels
    # Row layout: 1024 red values, then green, then blue, each 32 rows of 32.
    row, c, i, j = 13, 2, 5, 30
    assert train.inputs[row, c, i, j].item() == data[row, c * 1024 + i * 32 + j]
    assert torch.equal(train.inputs.reshape(30, -1), torch.from_numpy(data))
    meta = members["meta" if hundred else "batches.meta"]
    assert train.classes == meta["fine_label_names" if hundred else "label_names"]
    assert train.default_augment == Augment(crop_padding=4, flip=True)
    assert train.mean == ((0.5071, 0.4865, 0.4409) if hundred else (0.4914, 0.4822, 0.4465))


def test_cifar_missing_member_and_corrupt_archive(tmp_path):
    write_cifar(tmp_path, hundred=False, packed=False)
    (tmp_path / "cifar-10-batches-py" / "data_batch_3").unlink()
    with pytest.raises(DataError, match="missing data_batch_3"):
        load_dataset("cifar10", "train", root=tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").write_bytes(b"\x80\x02}q\x01(U\x04data")
    with pytest.raises(DataError, match="test_batch: corrupt pickle"):
        load_dataset("cifar10", "test", root=tmp_path)
    archive = tmp_path / "packed" / "cifar-10-python.tar.gz"
    archive.parent.mkdir()
    archive.write_bytes(b"\x1f\x8b not really gzip")
    with pytest.raises(DataError, match="cifar-10-python.tar.gz: cannot read archive"):
        load_dataset("cifar10", "train", root=archive.parent)


class _Exploit:
    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.mark.parametrize("protocol", [2, pickle.HIGHEST_PROTOCOL])
def test_restricted_unpickler_refuses_code(tmp_path, protocol):
    marker = tmp_path / "pwned"
    payload = pickle.dumps({"data": _Exploit(marker)}, protocol=protocol)
    with pytest.raises(DataError, match=r"refusing to unpickle global (posix|os)\.system"):
        restricted_loads(payload, "evil")
    assert not marker.exists()
    with pytest.raises(DataError, match="refusing to unpickle global builtins.eval"):
        restricted_loads(pickle.dumps(_Eval()), "evil")


class _Eval:
    def __reduce__(self):
        return (eval, ("1 + 1",))


def test_restricted_unpickler_loads_py2_arrays():
    array = np.arange(24, dtype=np.uint8).reshape(2, 12)
    loaded = restricted_loads(py2_pickle({"data": array, "labels": [1, 300, 70000], "name": "x"}))
    assert loaded["labels"] == [1, 300, 70000] and loaded["name"] == "x"
    np.testing.assert_array_equal(loaded["data"], array)


# --- image folders ---------------------------------------------------------------------------------


def test_imagenet_layout(tmp_path):
    write_imagenet(tmp_path)
    train, test = load_dataset("imagenet", "train", root=tmp_path), load_dataset("imagenet", "test", root=tmp_path)
    assert isinstance(train, FolderDataset)
    assert train.classes == ["n01", "n02", "n03"] and len(train) == 9 and len(test) == 6
    assert train.labels.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert train.input_shape == (3, 224, 224) and train.mean == (0.485, 0.456, 0.406)
    loader = make_loader(train, 4, train=True, device="cpu", seed=0, num_workers=0)
    batches = list(loader)
    assert [tuple(x.shape) for x, _ in batches] == [(4, 3, 224, 224), (4, 3, 224, 224), (1, 3, 224, 224)]
    assert sorted(torch.cat([y for _, y in batches]).tolist()) == train.labels.tolist()
    evaluation = list(make_loader(test, 4, train=False, device="cpu", seed=0, num_workers=0))
    assert torch.cat([y for _, y in evaluation]).tolist() == test.labels.tolist()


def test_tiny_imagenet_layout_and_exact_pixels(tmp_path):
    from PIL import Image

    pixels = write_tiny_imagenet(tmp_path)
    train, test = load_dataset("tiny_imagenet", "train", root=tmp_path), load_dataset("tiny_imagenet", "test", root=tmp_path)
    assert train.classes == ["n01", "n05", "n09"] and len(train) == 6
    assert [Path(p).name for p, _ in test.samples] == ["val_0.JPEG", "val_1.JPEG", "val_2.JPEG", "val_3.JPEG"]
    assert test.labels.tolist() == [1, 2, 0, 1]
    assert train.default_augment == Augment(crop_padding=4, flip=True) and train.input_shape == (3, 64, 64)
    # Evaluation is the identity on 64x64 images: the decoded pixels are PIL's, untouched.
    decoded = np.asarray(Image.open(test.samples[2][0]).convert("RGB"))
    assert np.abs(decoded.astype(int) - pixels["val_2.JPEG"]).mean() < 3  # JPEG is lossy, but it is that image
    assert torch.equal(test.decode(2, train=False, seed=0), torch.from_numpy(decoded.copy()).permute(2, 0, 1))
    x, y = next(iter(make_loader(test, 4, train=False, device="cpu", seed=0, num_workers=0)))
    mean, std = torch.tensor(test.mean).view(1, 3, 1, 1), torch.tensor(test.std).view(1, 3, 1, 1)
    expected = (torch.from_numpy(decoded.copy()).permute(2, 0, 1).float() / 255 - mean[0]) / std[0]
    torch.testing.assert_close(x[2], expected)
    # The worker root can also be the tiny-imagenet-200 folder itself.
    assert len(load_dataset("tiny_imagenet", "train", root=tmp_path / "tiny-imagenet-200")) == 6


def test_tiny_imagenet_bad_layout(tmp_path):
    write_tiny_imagenet(tmp_path)
    images = tmp_path / "tiny-imagenet-200" / "train" / "n05" / "images"
    images.rename(images.with_name("pictures"))
    with pytest.raises(DataError, match="train/n05/images: cannot list images"):
        load_dataset("tiny_imagenet", "train", root=tmp_path)
    path = tmp_path / "tiny-imagenet-200" / "val" / "val_annotations.txt"
    path.write_text("val_0.JPEG\tn77\t0\t0\t1\t1\n")
    with pytest.raises(DataError, match=r"val_annotations.txt:1: .*known wnid"):
        load_dataset("tiny_imagenet", "test", root=tmp_path)


def test_folder_loader_is_deterministic_across_worker_counts(tmp_path):
    write_tiny_imagenet(tmp_path)
    train = load_dataset("tiny_imagenet", "train", root=tmp_path)

    def epoch(workers: int, epoch: int) -> list:
        loader = make_loader(train, 4, train=True, device="cpu", seed=3, num_workers=workers)
        loader.set_epoch(epoch)
        return list(loader)

    serial, parallel = epoch(0, 1), epoch(1, 1)
    assert len(serial) == 2
    for (xa, ya), (xb, yb) in zip(serial, parallel):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    assert not all(torch.equal(a[1], b[1]) for a, b in zip(serial, epoch(0, 2)))


def test_image_folder_generic(tmp_path):
    for split in ("train", "val"):
        for c in ("cat", "dog"):
            write_jpeg(tmp_path / split / c / "a.png", (50, 40), seed=len(c))
    ds = load_dataset("image_folder", "test", root=tmp_path, image_size=32)
    assert ds.classes == ["cat", "dog"] and ds.input_shape == (3, 32, 32) and ds.resize == 37
    x, _ = next(iter(make_loader(ds, 2, train=True, device="cpu", seed=0, num_workers=0)))
    assert x.shape == (2, 3, 32, 32)
    with pytest.raises(DataError, match="needs root=DIR"):
        load_dataset("image_folder", "train")
    with pytest.raises(DataError, match="train/cat/train: no such directory"):
        load_dataset("image_folder", "train", root=tmp_path / "train" / "cat")
    (tmp_path / "empty" / "train").mkdir(parents=True)
    with pytest.raises(DataError, match="no class folders"):
        load_dataset("image_folder", "train", root=tmp_path / "empty")


def test_resize_center_crop_and_random_resized_crop():
    import random

    from PIL import Image

    img = Image.fromarray(np.random.default_rng(0).integers(0, 256, (200, 300, 3), dtype=np.uint8))
    out = resize_center_crop(img, 256, 224)
    reference = img.resize((384, 256), resample=Image.BILINEAR).crop((80, 16, 304, 240))
    assert np.array_equal(np.asarray(out), np.asarray(reference))
    a = random_resized_crop(img, 64, random.Random(5))
    b = random_resized_crop(img, 64, random.Random(5))
    assert a.size == (64, 64) and np.array_equal(np.asarray(a), np.asarray(b))
    # Impossible scale forces the fallback: the largest centred crop with an allowed aspect ratio.
    wide = Image.fromarray(np.zeros((10, 100, 3), np.uint8))
    assert random_resized_crop(wide, 8, random.Random(0), scale=(2.0, 3.0)).size == (8, 8)


# --- digits and the Gaussian mixture ---------------------------------------------------------------


def test_digits_split_is_fixed_stratified_and_complete():
    from sklearn.datasets import load_digits

    train, test = load_dataset("digits", "train"), load_dataset("digits", "test")
    assert (len(train), len(test)) == (1442, 355) and train.input_shape == (1, 8, 8)
    full = load_digits()
    counts = np.bincount(full.target)
    assert test.labels.bincount().tolist() == (counts // 5).tolist()
    assert int(train.inputs.max()) == 255 and int(train.inputs.min()) == 0
    scaled = np.round(full.images * 255 / 16).astype(np.uint8)
    rows = {x.tobytes() + bytes([y]) for x, y in zip(scaled, full.target)}
    ours = [x.numpy().tobytes() + bytes([int(y)]) for ds in (train, test) for x, y in zip(ds.inputs[:, 0], ds.labels)]
    assert len(ours) == 1797 and set(ours) == rows
    assert torch.equal(load_dataset("digits", "test").inputs, test.inputs)  # the split is fixed
    pixels = train.inputs.double() / 255
    assert train.mean[0] == pytest.approx(pixels.mean().item(), abs=1e-4) and test.mean == train.mean


def test_gaussian_mixture_geometry_and_determinism():
    kwargs = dict(num_classes=4, dim=8, n_per_class=3000, separation=5.0, seed=7)
    train = load_dataset("gaussian_mixture", "train", **kwargs)
    assert train.inputs.shape == (12000, 8) and train.inputs.dtype == torch.float32
    assert train.input_shape == (8,) and train.in_channels == 8 and train.num_classes == 4
    assert torch.equal(train.inputs, load_dataset("gaussian_mixture", "train", **kwargs).inputs)
    test = load_dataset("gaussian_mixture", "test", **kwargs)
    assert not torch.equal(train.inputs, test.inputs)
    means = torch.stack([train.inputs[train.labels == k].mean(0) for k in range(4)])
    test_means = torch.stack([test.inputs[test.labels == k].mean(0) for k in range(4)])
    torch.testing.assert_close(means, test_means, atol=0.12, rtol=0)  # shared means, N(0, 1/3000) noise
    distances = torch.pdist(means.double())
    torch.testing.assert_close(distances, torch.full_like(distances, 5.0), atol=0.12, rtol=0)
    residual = train.inputs - means[train.labels]
    assert residual.var(0).mean().item() == pytest.approx(1.0, abs=0.05)
    other = load_dataset("gaussian_mixture", "train", **{**kwargs, "seed": 8})
    assert not torch.equal(train.inputs, other.inputs)
    many = load_dataset("gaussian_mixture", "train", num_classes=20, dim=3, n_per_class=2)
    assert many.inputs.shape == (40, 3)
    with pytest.raises(DataError, match="num_classes >= 2"):
        load_dataset("gaussian_mixture", "train", num_classes=1)


# --- TensorDataset ---------------------------------------------------------------------------------


def tiny_images(n: int = 40, classes: int = 4, size: int = 6) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 256, (n, 3, size, size), generator=g, dtype=torch.uint8)
    return TensorDataset(
        inputs, torch.arange(n) % classes, [str(c) for c in range(classes)], (0.5, 0.4, 0.3), (0.2, 0.25, 0.3), "tiny"
    )


def test_tensor_dataset_validation():
    ds = tiny_images()
    with pytest.raises(DataError, match="inputs must be uint8 or float32"):
        TensorDataset(ds.inputs.double(), ds.labels, ds.classes, ds.mean, ds.std, "bad")
    floats = TensorDataset(ds.inputs.float() / 255, ds.labels, ds.classes, ds.mean, ds.std, "float images")
    x, _ = next(iter(make_loader(floats, 4, train=False, device="cpu", seed=0)))
    y, _ = next(iter(make_loader(ds, 4, train=False, device="cpu", seed=0)))
    assert floats.full_scale == 1.0 and torch.allclose(x, y, atol=1e-5)  # [0, 1] floats normalise as uint8 does
    with pytest.raises(DataError, match=r"labels must lie in \[0, 3\)"):
        TensorDataset(ds.inputs, ds.labels, ds.classes[:3], ds.mean, ds.std, "bad")
    with pytest.raises(DataError, match="labels must be int64"):
        TensorDataset(ds.inputs, ds.labels.int(), ds.classes, ds.mean, ds.std, "bad")
    with pytest.raises(DataError, match="mean/std need 1 or 3 values"):
        TensorDataset(ds.inputs, ds.labels, ds.classes, (0.1, 0.2), (0.3, 0.3), "bad")


def test_subset_is_balanced_seeded_and_sorted():
    ds = tiny_images(n=40, classes=4)
    a, b, c = ds.subset(3, seed=1), ds.subset(3, seed=1), ds.subset(3, seed=2)
    assert a.labels.bincount().tolist() == [3, 3, 3, 3] and torch.equal(a.inputs, b.inputs)
    assert not torch.equal(a.inputs, c.inputs)
    rows = [int(torch.nonzero((ds.inputs == x).all(dim=(1, 2, 3)))[0]) for x in a.inputs]
    assert rows == sorted(rows)
    assert torch.equal(ds.subset(indices=[5, 1]).inputs, ds.inputs[[5, 1]])
    with pytest.raises(DataError, match="smallest class has 10"):
        ds.subset(11)
    with pytest.raises(DataError, match="exactly one"):
        ds.subset(2, indices=[1])
    with pytest.raises(DataError, match=r"must lie in \[0, 40\)"):
        ds.subset(indices=[40])


# --- loader ----------------------------------------------------------------------------------------


def slow_augment(x: torch.Tensor, offsets, flips, padding: int) -> torch.Tensor:
    """Per-sample reference: zero-pad with numpy, slice the crop, mirror the columns."""
    out = []
    for b in range(len(x)):
        img = np.pad(x[b].numpy(), ((0, 0), (padding, padding), (padding, padding)))
        oy, ox = (int(v) for v in offsets[b]) if offsets is not None else (0, 0)
        img = img[:, oy : oy + x.shape[2], ox : ox + x.shape[3]]
        if flips is not None and flips[b]:
            img = img[:, :, ::-1]
        out.append(torch.from_numpy(img.copy()))
    return torch.stack(out)


@pytest.mark.parametrize("padding, flip", [(4, True), (4, False), (0, True), (2, True)])
def test_augment_batch_matches_per_sample_reference(padding, flip):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, 256, (16, 3, 7, 9), generator=g, dtype=torch.uint8)
    offsets = torch.randint(0, 2 * padding + 1, (16, 2), generator=g) if padding else None
    flips = torch.randint(0, 2, (16,), generator=g).bool() if flip else None
    assert torch.equal(augment_batch(x, offsets, flips, padding), slow_augment(x, offsets, flips, padding))
    assert torch.equal(augment_batch(x, None, None, 0), x)


def test_augment_batch_extremes():
    x = torch.arange(2 * 1 * 3 * 3, dtype=torch.uint8).reshape(2, 1, 3, 3)
    corner = augment_batch(x, torch.tensor([[0, 0], [2, 2]]), None, 1)
    assert corner[0, 0].tolist() == [[0, 0, 0], [0, 0, 1], [0, 3, 4]]
    assert corner[1, 0].tolist() == [[13, 14, 0], [16, 17, 0], [0, 0, 0]]
    flipped = augment_batch(x, None, torch.tensor([True, False]), 0)
    assert torch.equal(flipped[0], x[0].flip(-1)) and torch.equal(flipped[1], x[1])


def collect(loader, epoch: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    loader.set_epoch(epoch)
    return list(loader)


def test_loader_eval_is_ordered_normalised_and_complete():
    ds = tiny_images(n=10)
    loader = make_loader(ds, 4, train=False, device="cpu", seed=0)
    batches = list(loader)
    assert len(loader) == 3 and [len(y) for _, y in batches] == [4, 4, 2]
    x = torch.cat([b[0] for b in batches])
    mean, std = torch.tensor(ds.mean).view(1, 3, 1, 1), torch.tensor(ds.std).view(1, 3, 1, 1)
    torch.testing.assert_close(x, (ds.inputs.float() / 255 - mean) / std)
    assert x.dtype == torch.float32 and torch.equal(torch.cat([b[1] for b in batches]), ds.labels)


def test_loader_training_is_a_function_of_seed_and_epoch():
    ds = tiny_images(n=40)
    make = lambda seed: make_loader(ds, 8, train=True, device="cpu", seed=seed, augment=Augment(2, True))  # noqa: E731
    a, b = collect(make(0), 3), collect(make(0), 3)
    for (xa, ya), (xb, yb) in zip(a, b):
        assert torch.equal(xa, xb) and torch.equal(ya, yb)
    order = lambda batches: torch.cat([y for _, y in batches])  # noqa: E731
    x_of = lambda batches: torch.cat([x for x, _ in batches])  # noqa: E731
    assert not torch.equal(x_of(a), x_of(collect(make(0), 4)))  # another epoch: another order/augmentation
    assert not torch.equal(x_of(a), x_of(collect(make(1), 3)))  # another seed
    assert sorted(order(a).tolist()) == sorted(ds.labels.tolist())  # a permutation of the whole set
    loader = make(0)
    assert torch.equal(x_of(collect(loader, 3)), x_of(collect(loader, 3)))  # re-iterating repeats the epoch


def test_loader_training_batches_match_the_reference_augmentation():
    ds = tiny_images(n=24)
    loader = make_loader(ds, 24, train=True, device="cpu", seed=5, augment=Augment(3, True))
    loader.set_epoch(2)
    x, y = next(iter(loader))
    plan = loader._plan(torch.device("cpu"))
    expected = slow_augment(ds.inputs[plan["index"]], plan["offsets"], plan["flips"], 3)
    mean, std = torch.tensor(ds.mean).view(1, 3, 1, 1), torch.tensor(ds.std).view(1, 3, 1, 1)
    torch.testing.assert_close(x, (expected.float() / 255 - mean) / std)
    assert torch.equal(y, ds.labels[plan["index"]])
    assert set(plan["offsets"].flatten().tolist()) == set(range(7)) and 0 < plan["flips"].sum() < 24


def test_default_augment_and_vectors():
    ds = tiny_images(n=8)
    ds.default_augment = Augment(2, True)
    assert make_loader(ds, 4, train=True, device="cpu", seed=0).augment == Augment(2, True)
    assert make_loader(ds, 4, train=True, device="cpu", seed=0, augment=Augment()).augment == Augment()
    assert make_loader(ds, 4, train=False, device="cpu", seed=0).augment == Augment()
    vectors = load_dataset("gaussian_mixture", "train", num_classes=3, dim=5, n_per_class=4)
    x, y = next(iter(make_loader(vectors, 12, train=False, device="cpu", seed=0)))
    assert torch.equal(x, vectors.inputs) and torch.equal(y, vectors.labels)
    with pytest.raises(DataError, match="augmentation needs images"):
        make_loader(vectors, 4, train=True, device="cpu", seed=0, augment=Augment(flip=True))


def test_ddp_shards_are_disjoint_equal_and_cover_the_permutation():
    ds = tiny_images(n=50)
    ds.inputs = torch.arange(50, dtype=torch.uint8).view(50, 1, 1, 1).expand(50, 3, 6, 6).contiguous()
    ids = lambda batches: torch.cat([x[:, 0, 0, 0] for x, _ in batches])  # noqa: E731

    def sample_ids(rank: int, world: int, train: bool) -> torch.Tensor:
        loader = make_loader(ds, 4, train=train, device="cpu", seed=9, augment=Augment(), rank=rank, world_size=world)
        values = ids(collect(loader, 1))
        return torch.round(values * ds.std[0] * 255 + ds.mean[0] * 255).long()  # undo the normalisation

    single = sample_ids(0, 1, True)
    shards = [sample_ids(r, 3, True) for r in range(3)]
    assert [len(s) for s in shards] == [16, 16, 16]
    together = torch.cat(shards)
    assert len(set(together.tolist())) == 48  # disjoint
    interleaved = torch.stack(shards, 1).flatten()  # rank r holds positions r, r + 3, ...
    assert torch.equal(interleaved, single[:48])  # the same permutation as one process
    eval_shards = [sample_ids(r, 3, False) for r in range(3)]
    assert sorted(torch.cat(eval_shards).tolist()) == list(range(50))  # evaluation keeps everything


def test_loader_length_and_drop_last():
    ds = tiny_images(n=10)
    assert len(make_loader(ds, 4, train=True, device="cpu", seed=0)) == 3
    loader = make_loader(ds, 4, train=True, device="cpu", seed=0, drop_last=True)
    assert len(loader) == 2 and [len(y) for _, y in loader] == [4, 4]
    assert len(make_loader(ds, 4, train=True, device="cpu", seed=0, world_size=3, rank=2)) == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(batch_size=0), "batch_size must be a positive int"),
        (dict(rank=2, world_size=2), "need 0 <= rank < world_size"),
        (dict(train=False, drop_last=True), "evaluation loaders keep every sample"),
        (dict(seed=-1), "seeds must be non-negative ints"),
        (dict(augment="crop"), "augment must be an Augment"),
        (dict(world_size=11, rank=0), "cannot be split over 11 ranks"),
    ],
)
def test_loader_argument_errors(kwargs, message):
    args = dict(batch_size=4, train=True, device="cpu", seed=0) | kwargs
    with pytest.raises(DataError, match=message):
        make_loader(tiny_images(n=10), **args)


def test_augment_validation():
    with pytest.raises(DataError, match="crop_padding must be an int >= 0"):
        Augment(crop_padding=-1)
