"""MNIST and Fashion-MNIST from their IDX files (``.gz`` or uncompressed).

IDX layout: two zero bytes, a type code (``0x08`` = uint8), the number of dimensions ``k``, then ``k``
big-endian uint32 sizes, then the data in row-major order. Labels are ``k = 1``, images ``k = 3``.
"""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import numpy as np
import torch

from kdcollapse.data._dataset import Augment, TensorDataset, register_dataset
from kdcollapse.errors import DataError

_IDX_TYPES = {
    0x08: np.dtype(">u1"), 0x09: np.dtype(">i1"), 0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8"),
}  # fmt: skip

_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_MARKERS = ("train-images-idx3-ubyte.gz", "train-images-idx3-ubyte", "t10k-images-idx3-ubyte.gz")


# Larger than any IDX dataset (Fashion-MNIST's training images are 47 MB); a header implying more is refused.
MAX_IDX_BYTES = 1 << 32
_CHUNK = 1 << 20


def read_idx(path: str | Path) -> np.ndarray:
    """Read one IDX file (gzip-compressed if its name ends in ``.gz``) into a numpy array.

    The payload is read in chunks, at most one byte past the size its header implies, so a gzip bomb
    stops there instead of filling the memory. Raises ``DataError`` naming the file for a bad magic
    number, an unknown type code, a header implying more than ``MAX_IDX_BYTES``, a truncated or
    over-long payload, or a corrupt gzip stream.
    """
    path = Path(path)
    try:
        with gzip.open(path, "rb") if path.suffix == ".gz" else open(path, "rb") as f:
            dtype, shape, header = _read_header(f, path)
            size = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
            if size > MAX_IDX_BYTES:
                raise DataError(f"{path}: the header {shape} implies {size} bytes, more than the limit of "
                                f"{MAX_IDX_BYTES}")
            data = _read_at_most(f, size + 1)
    except (OSError, EOFError, zlib.error) as err:  # gzip.BadGzipFile is an OSError
        raise DataError(f"{path}: cannot read ({type(err).__name__}: {err})") from None
    if len(data) < size:
        raise DataError(f"{path}: truncated: {header + len(data)} bytes, but the header {shape} implies "
                        f"{header + size}")
    if len(data) > size:
        raise DataError(f"{path}: has trailing bytes: more than the {header + size} bytes the header {shape} implies")
    return np.frombuffer(data, dtype).reshape(shape)


def _read_header(f, path: Path) -> tuple[np.dtype, tuple[int, ...], int]:
    """The element type, the shape and the header's length in bytes."""
    magic = f.read(4)
    if len(magic) < 4 or magic[0] != 0 or magic[1] != 0:
        raise DataError(f"{path}: not an IDX file (magic number must start with two zero bytes)")
    type_code, ndim = magic[2], magic[3]
    if type_code not in _IDX_TYPES:
        valid = ", ".join(f"0x{t:02X}" for t in _IDX_TYPES)
        raise DataError(f"{path}: unknown IDX type code 0x{type_code:02X} (valid: {valid})")
    header = 4 + 4 * ndim
    dims = f.read(4 * ndim)
    if len(dims) < 4 * ndim:
        raise DataError(f"{path}: truncated header ({4 + len(dims)} bytes, need {header} for {ndim} dimensions)")
    return _IDX_TYPES[type_code], tuple(int(d) for d in np.frombuffer(dims, ">u4")), header


def _read_at_most(f, limit: int) -> bytearray:
    """Up to ``limit`` bytes from ``f``, in chunks (memory grows with the data that is really there)."""
    data = bytearray()
    while len(data) < limit and (chunk := f.read(min(_CHUNK, limit - len(data)))):
        data += chunk
    return data


def _find_file(root: Path, stem: str) -> Path:
    for candidate in (root / stem, root / f"{stem}.gz"):
        if candidate.exists():
            return candidate
    raise DataError(f"{root}: missing {stem}.gz (or uncompressed {stem})")


def load_idx_split(
    root: Path, split: str, name: str, classes: list[str], mean: float, std: float
) -> TensorDataset:
    """One split of an MNIST-format dataset: uint8 images ``(N, 1, 28, 28)``, int64 labels ``(N,)``."""
    image_file, label_file = (_find_file(root, stem) for stem in _FILES[split])
    images, labels = read_idx(image_file), read_idx(label_file)
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise DataError(
            f"{image_file}: expected uint8 images of shape (N, 28, 28), got {images.dtype} {images.shape}"
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise DataError(
            f"{label_file}: expected uint8 labels of shape (N,), got {labels.dtype} {labels.shape}"
        )
    if len(images) != len(labels):
        raise DataError(f"{image_file} has {len(images)} images but {label_file} has {len(labels)} labels")
    if len(labels) and labels.max() >= len(classes):
        raise DataError(f"{label_file}: label {labels.max()} out of range [0, {len(classes)})")
    return TensorDataset(
        inputs=torch.from_numpy(images.copy()).unsqueeze(1),
        labels=torch.from_numpy(labels.astype(np.int64)),
        classes=classes,
        mean=(mean,),
        std=(std,),
        name=name,
        default_augment=Augment(),
    )


FASHION_MNIST_CLASSES = [
    "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
]  # fmt: skip


@register_dataset(
    "fashion_mnist",
    description="Fashion-MNIST: 70k 28x28 grey images of 10 clothing classes (60k train / 10k test), IDX",
    markers=_MARKERS,
    system_paths=("/usr/share/datasets/fashion-mnist",),
    get="Get it with `kdcollapse data download fashion_mnist` or `apt-get install dataset-fashion-mnist`.",
)
def fashion_mnist(root: Path, split: str) -> TensorDataset:
    """Fashion-MNIST (Xiao et al. 2017); normalised with mean 0.2860, std 0.3530."""
    return load_idx_split(root, split, "fashion_mnist", FASHION_MNIST_CLASSES, 0.2860, 0.3530)


@register_dataset(
    "mnist",
    description="MNIST: 70k 28x28 grey handwritten digits (60k train / 10k test), IDX",
    markers=_MARKERS,
    get="Get it with `kdcollapse data download mnist`.",
)
def mnist(root: Path, split: str) -> TensorDataset:
    """MNIST (LeCun et al. 1998); normalised with mean 0.1307, std 0.3081."""
    return load_idx_split(root, split, "mnist", [str(d) for d in range(10)], 0.1307, 0.3081)
