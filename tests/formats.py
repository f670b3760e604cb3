"""Small files in the official formats of the datasets the tests cannot download: IDX (MNIST,
Fashion-MNIST), the CIFAR-10/100 python pickles (as Python 2 wrote them), ImageNet and Tiny-ImageNet
folders. Used by tests/test_data.py and tests/test_data_download.py."""

from __future__ import annotations

import gzip
import io
import struct
import tarfile
from pathlib import Path

import numpy as np


def idx_bytes(array: np.ndarray) -> bytes:
    """An IDX file: 0, 0, type 0x08 (uint8), ndim, big-endian uint32 dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(np.uint8).tobytes()


def write_idx_files(folder: Path, n_train: int = 30, n_test: int = 20, compress: bool = True) -> dict:
    """MNIST-layout files of random 28x28 images with labels ``i % 10``; returns the arrays written."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(0)
    arrays = {}
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        images = rng.integers(0, 256, (n, 28, 28), dtype=np.uint8)
        labels = (np.arange(n) % 10).astype(np.uint8)
        for kind, array in (("images-idx3", images), ("labels-idx1", labels)):
            data = idx_bytes(array)
            name = f"{prefix}-{kind}-ubyte"
            if compress:
                (folder / f"{name}.gz").write_bytes(gzip.compress(data))
            else:
                (folder / name).write_bytes(data)
        arrays[prefix] = (images, labels)
    return arrays


def py2_pickle(obj) -> bytes:
    """Pickle ``obj`` as Python 2's cPickle (protocol 2) wrote the official CIFAR files: str as
    SHORT_BINSTRING/BINSTRING, numpy arrays through ``numpy.core.multiarray._reconstruct``, memo puts."""
    out = bytearray(b"\x80\x02")
    memo = iter(range(1, 1 << 30))

    def put():
        out.extend(b"q" + bytes([next(memo) % 256]))

    def save(o):
        if isinstance(o, dict):
            out.extend(b"}")
            put()
            if o:
                out.extend(b"(")
                for k, v in o.items():
                    save(k)
                    save(v)
                out.extend(b"u")
        elif isinstance(o, list):
            out.extend(b"]")
            put()
            if o:
                out.extend(b"(")
                for v in o:
                    save(v)
                out.extend(b"e")
        elif isinstance(o, tuple):
            for v in o:
                save(v) if len(o) <= 3 else None
            if len(o) <= 3:
                out.extend({1: b"\x85", 2: b"\x86", 3: b"\x87"}[len(o)])
            else:
                out.extend(b"(")
                for v in o:
                    save(v)
                out.extend(b"t")
        elif isinstance(o, bool):
            out.extend(b"\x88" if o else b"\x89")
        elif o is None:
            out.extend(b"N")
        elif isinstance(o, int):
            if 0 <= o < 256:
                out.extend(b"K" + bytes([o]))
            elif 0 <= o < 65536:
                out.extend(b"M" + struct.pack("<H", o))
            else:
                out.extend(b"J" + struct.pack("<i", o))
        elif isinstance(o, (str, bytes)):
            data = o.encode("latin1") if isinstance(o, str) else o
            out.extend(b"U" + bytes([len(data)]) if len(data) < 256 else b"T" + struct.pack("<I", len(data)))
            out.extend(data)
            if len(data) > 1:
                put()
        elif isinstance(o, np.ndarray):
            assert o.dtype == np.uint8
            out.extend(b"cnumpy.core.multiarray\n_reconstruct\n")
            put()
            out.extend(b"cnumpy\nndarray\n")
            put()
            out.extend(b"K\x00\x85U\x01b\x87R")
            put()
            out.extend(b"(K\x01")
            save(tuple(o.shape))
            out.extend(b"cnumpy\ndtype\n")
            put()
            out.extend(b"U\x02u1K\x00K\x01\x87R")
            put()
            out.extend(b"(K\x03U\x01|NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89")
            save(o.tobytes())
            out.extend(b"tb")
        else:
            raise TypeError(type(o))

    save(obj)
    return bytes(out + b".")


def cifar_members(hundred: bool, per_batch: int = 6) -> tuple[dict[str, bytes], dict]:
    """The members of a small CIFAR-10 (or -100) release with the official names and keys."""
    rng = np.random.default_rng(1)
    k = 100 if hundred else 10
    names = [f"class_{i}" for i in range(k)]

    def batch(label: str, n: int, offset: int) -> dict:
        labels = [(offset + i) % k for i in range(n)]
        data = rng.integers(0, 256, (n, 3072), dtype=np.uint8)
        b = {"batch_label": label, "data": data, "filenames": [f"img_{offset + i}.png" for i in range(n)]}
        if hundred:
            b.update(fine_labels=labels, coarse_labels=[x // 5 for x in labels])
        else:
            b["labels"] = labels
        return b

    if hundred:
        batches = {"train": batch("training batch 1 of 1", 5 * per_batch, 0), "test": batch("testing batch 1 of 1", 7, 3)}
        meta = {"fine_label_names": names, "coarse_label_names": [f"super_{i}" for i in range(20)]}
        members = {**batches, "meta": meta}
    else:
        batches = {f"data_batch_{i}": batch(f"training batch {i} of 5", per_batch, i * per_batch) for i in range(1, 6)}
        batches["test_batch"] = batch("testing batch 1 of 1", 7, 3)
        members = {**batches, "batches.meta": {"num_cases_per_batch": per_batch, "label_names": names, "num_vis": 3072}}
    return {name: py2_pickle(obj) for name, obj in members.items()}, members


def write_cifar(root: Path, hundred: bool, packed: bool) -> dict:
    folder = "cifar-100-python" if hundred else "cifar-10-batches-py"
    files, members = cifar_members(hundred)
    root.mkdir(parents=True, exist_ok=True)
    if packed:
        with tarfile.open(root / f"{folder.replace('-batches-py', '-python')}.tar.gz", "w:gz") as tar:
            for name, data in files.items():
                info = tarfile.TarInfo(f"{folder}/{name}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    else:
        (root / folder).mkdir()
        for name, data in files.items():
            (root / folder / name).write_bytes(data)
    return members


def write_jpeg(path: Path, size: tuple[int, int], seed: int) -> np.ndarray:
    from PIL import Image

    path.parent.mkdir(parents=True, exist_ok=True)
    # Smooth gradients with a per-image colour survive JPEG compression almost unchanged.
    colour = np.random.default_rng(seed).integers(0, 128, 3)
    rows, cols = np.mgrid[: size[1], : size[0]]
    pixels = (colour + (2 * rows + cols)[..., None] % 128).astype(np.uint8)
    Image.fromarray(pixels).save(path, quality=95)
    return pixels


def write_imagenet(root: Path) -> None:
    for split, count in (("train", 3), ("val", 2)):
        for c, wnid in enumerate(["n02", "n01", "n03"]):
            for i in range(count):
                write_jpeg(root / split / wnid / f"{wnid}_{i}.JPEG", (40 + 7 * i, 30 + 5 * c), seed=10 * c + i)
    (root / "train" / "n01" / "notes.txt").write_text("not an image")


def write_tiny_imagenet(root: Path) -> dict[str, np.ndarray]:
    base = root / "tiny-imagenet-200"
    wnids = ["n09", "n01", "n05"]
    (base / "val" / "images").mkdir(parents=True)
    base.joinpath("wnids.txt").write_text("\n".join(wnids) + "\n")
    for c, wnid in enumerate(wnids):
        for i in range(2):
            write_jpeg(base / "train" / wnid / "images" / f"{wnid}_{i}.JPEG", (64, 64), seed=c * 2 + i)
        (base / "train" / wnid / f"{wnid}_boxes.txt").write_text("")
    lines, pixels = [], {}
    for i, wnid in enumerate(["n05", "n09", "n01", "n05"]):
        pixels[f"val_{i}.JPEG"] = write_jpeg(base / "val" / "images" / f"val_{i}.JPEG", (64, 64), seed=100 + i)
        lines.append(f"val_{i}.JPEG\t{wnid}\t0\t0\t63\t63")
    base.joinpath("val", "val_annotations.txt").write_text("\n".join(lines) + "\n")
    return pixels
