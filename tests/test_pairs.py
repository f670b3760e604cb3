"""``fashion_mnist_pairs``: built from small IDX files written here in the exact format, and from the
real Fashion-MNIST files when present; the zoo's models accept its 1×28×56 images."""

import gzip
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from kdcollapse.data import load_dataset, make_loader, search_paths
from kdcollapse.data._idx import FASHION_MNIST_CLASSES
from kdcollapse.data._pairs import PAIRS_PER_CLASS, pair_images
from kdcollapse.errors import DataError
from kdcollapse.models import create_model

REAL = Path("/usr/share/datasets/fashion-mnist")


def write_idx(path, array, compress):
    """IDX: two zero bytes, type 0x08 (uint8), the number of dimensions, big-endian uint32 sizes, data."""
    raw = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


@pytest.fixture(scope="module")
def tiny_root(tmp_path_factory):
    """3 train and 2 test images per class; image i of a split has every pixel of its top row equal to
    i (+ 100 for test images), so each half of a pair names its source."""
    root = tmp_path_factory.mktemp("fmnist_idx")
    for prefix, per_class, offset, compress in (("train", 3, 0, True), ("t10k", 2, 100, False)):
        labels = np.tile(np.arange(10, dtype=np.uint8), per_class)
        images = np.zeros((len(labels), 28, 28), dtype=np.uint8)
        images[:, 0, :] = (np.arange(len(labels)) + offset)[:, None]
        images[:, 1:, :] = labels[:, None, None] * 20  # content that differs by class, too
        suffix = ".gz" if compress else ""
        write_idx(root / f"{prefix}-images-idx3-ubyte{suffix}", images, compress)
        write_idx(root / f"{prefix}-labels-idx1-ubyte{suffix}", labels, compress)
    return root


def halves(dataset):
    """(left, right) source ids of every pair: the top-left pixel of each half."""
    return dataset.inputs[:, 0, 0, 0].long(), dataset.inputs[:, 0, 0, 28].long()


@pytest.mark.parametrize("split,per_class,offset", [("train", 3, 0), ("test", 2, 100)])
def test_pairs_from_idx_files(tiny_root, split, per_class, offset):
    data = load_dataset("fashion_mnist_pairs", split, root=tiny_root)
    n = PAIRS_PER_CLASS[split]
    assert data.inputs.dtype == torch.uint8 and data.input_shape == (1, 28, 56)
    assert torch.bincount(data.labels).tolist() == [n] * 100
    left, right = halves(data)
    # Only images of the matching split, each from the class its half of the label says (id % 10).
    assert int(left.min()) >= offset and int(left.max()) < offset + 10 * per_class
    assert torch.equal((left - offset) % 10, data.labels // 10) and torch.equal((right - offset) % 10, data.labels % 10)
    # Rows 1..27 are the source images' content: the class pattern of each side.
    assert torch.equal(data.inputs[:, 0, 5, 3].long(), data.labels // 10 * 20)
    assert torch.equal(data.inputs[:, 0, 5, 40].long(), data.labels % 10 * 20)
    # With 10 n slots per class side and `per_class` images, every image is used equally often.
    for side in (left, right):
        assert torch.bincount(side - offset).tolist() == [10 * n // per_class] * (10 * per_class)
    assert data.classes[1] == "T-shirt/top|Trouser" and data.classes[98] == "Ankle boot|Bag"
    assert data.superclasses == FASHION_MNIST_CLASSES
    assert [data.superclass[c] for c in (0, 9, 10, 99)] == [0, 0, 1, 9]


def test_pairs_are_deterministic_whatever_the_global_seed(tiny_root):
    torch.manual_seed(0)
    a = load_dataset("fashion_mnist_pairs", "test", root=tiny_root)
    torch.manual_seed(1)
    b = load_dataset("fashion_mnist_pairs", "test", root=tiny_root)
    assert torch.equal(a.inputs, b.inputs) and torch.equal(a.labels, b.labels)


def test_pair_images_uses_each_image_once_per_side_when_counts_match():
    # 10 n images per class (Fashion-MNIST's 6000 = 10 · 600): a permutation of each class per side.
    n, labels = 4, torch.arange(10).repeat(40)[torch.randperm(400, generator=torch.Generator().manual_seed(5))]
    images = torch.arange(400).to(torch.int32).view(400, 1, 1, 1)  # pixel = the image's id
    pairs, pair_labels = pair_images(images, labels, 10, n, seed=3)
    assert pairs.shape == (400, 1, 1, 2)
    left, right = pairs[:, 0, 0, 0].long(), pairs[:, 0, 0, 1].long()
    assert sorted(left.tolist()) == list(range(400)) and sorted(right.tolist()) == list(range(400))
    assert torch.equal(labels[left], pair_labels // 10) and torch.equal(labels[right], pair_labels % 10)
    again, _ = pair_images(images, labels, 10, n, seed=3)
    other, _ = pair_images(images, labels, 10, n, seed=4)
    assert torch.equal(pairs, again) and not torch.equal(pairs, other)
    with pytest.raises(DataError, match="class 9 has no image"):
        pair_images(images[labels < 9], labels[labels < 9], 10, n, seed=3)


def test_classes_subset_keeps_superclasses_and_files_are_searched_where_fashion_mnist_is(tiny_root):
    data = load_dataset("fashion_mnist_pairs", "test", root=tiny_root).select_classes([23, 5, 90])
    assert data.classes == ["Pullover|Dress", "T-shirt/top|Sandal", "Ankle boot|T-shirt/top"]
    assert data.superclass == [2, 0, 9] and data.subset(10, seed=0).superclass == [2, 0, 9]
    assert set(search_paths("fashion_mnist")) <= set(search_paths("fashion_mnist_pairs"))


@pytest.mark.skipif(not (REAL / "train-images-idx3-ubyte.gz").exists(), reason=f"Fashion-MNIST not in {REAL}")
@pytest.mark.parametrize("split", ["train", "test"])
def test_pairs_from_the_real_fashion_mnist(split):
    data, source = load_dataset("fashion_mnist_pairs", split), load_dataset("fashion_mnist", split)
    n = PAIRS_PER_CLASS[split]
    assert len(data) == 100 * n and torch.bincount(data.labels).tolist() == [n] * 100
    # Every source image once per side: the pixel sums are exactly twice the source's; mean/std as Fashion-MNIST.
    assert data.inputs.sum(dtype=torch.int64) == 2 * source.inputs.sum(dtype=torch.int64)
    assert (data.mean, data.std) == (source.mean, source.std)
    lookup = {bytes(img.numpy().tobytes()): int(y) for img, y in zip(source.inputs, source.labels)}
    for i in range(0, len(data), len(data) // 97):  # ~100 pairs across all classes: halves are source images
        y = int(data.labels[i])
        assert lookup[data.inputs[i, :, :, :28].contiguous().numpy().tobytes()] == y // 10
        assert lookup[data.inputs[i, :, :, 28:].contiguous().numpy().tobytes()] == y % 10


@pytest.mark.parametrize("name,kwargs", [("convnet", {}), ("convnet_small", {}), ("mlp", {"input_size": (28, 56)}),
                                         ("resnet8x4", {}), ("resnet32x4", {})])
def test_zoo_models_accept_pairs(tiny_root, name, kwargs):
    data = load_dataset("fashion_mnist_pairs", "test", root=tiny_root).subset(1, seed=0)
    x, _ = next(iter(make_loader(data, 4, train=False, device="cpu", seed=0)))
    assert x.shape == (4, 1, 28, 56)
    torch.manual_seed(0)
    model = create_model(name, 100, in_channels=1, **kwargs).eval()
    with torch.no_grad():
        features = model.forward_features(x)
        assert model.forward_head(features).shape == (4, 100) and torch.isfinite(features).all()
