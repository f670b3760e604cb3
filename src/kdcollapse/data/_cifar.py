"""CIFAR-10 and CIFAR-100 from the official python archives, read with a restricted unpickler.

The archives (``cifar-10-python.tar.gz``, ``cifar-100-python.tar.gz``) hold Python 2 pickles of dicts:
``data`` is a uint8 array ``(N, 3072)`` (1024 red, then green, then blue values of a 32x32 image, rows
first), the labels are lists of ints (``labels`` in CIFAR-10; ``fine_labels`` and ``coarse_labels`` in
CIFAR-100, of which we use the fine ones) and the meta file names the classes. Either the archive or
its extracted folder may be present.
"""

from __future__ import annotations

import io
import pickle
import tarfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kdcollapse.data._dataset import Augment, TensorDataset, register_dataset
from kdcollapse.errors import DataError

# The only globals a CIFAR pickle refers to: numpy's array and dtype reconstruction.
_RECONSTRUCT = np.ndarray(0).__reduce__()[0]
_ALLOWED_GLOBALS = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class RestrictedUnpickler(pickle.Unpickler):
    """Unpickles builtin containers, strings, numbers and numpy arrays, and nothing else.

    Every global a pickle asks for goes through :meth:`find_class`; anything outside the three numpy
    names above (``os.system``, ``builtins.eval``, ...) raises ``DataError`` before it is called.
    """

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED_GLOBALS[(module, name)]
        except KeyError:
            raise DataError(
                f"refusing to unpickle global {module}.{name}: "
                "only numpy arrays and builtin types are allowed"
            ) from None


def restricted_loads(data: bytes, source: str = "pickle") -> Any:
    """``pickle.loads`` through :class:`RestrictedUnpickler` (Python 2 strings decoded as latin-1)."""
    try:
        return RestrictedUnpickler(io.BytesIO(data), encoding="latin1").load()
    except DataError as err:
        raise DataError(f"{source}: {err}") from None
    except Exception as err:  # a truncated or corrupt pickle raises many different types
        raise DataError(f"{source}: corrupt pickle ({type(err).__name__}: {err})") from None


class _Archive:
    """The members of a CIFAR release, read from the packed ``.tar.gz`` or from the extracted folder."""

    def __init__(self, root: Path, archive: str, folder: str, meta: str):
        self.folder = folder
        if (root / meta).is_file():  # root is the extracted folder itself
            self.dir, self.tar = root, None
        elif (root / folder).is_dir():
            self.dir, self.tar = root / folder, None
        else:
            self.dir, self.tar = None, root / archive

    def read(self, names: list[str]) -> dict[str, Any]:
        if self.dir is not None:
            missing = [n for n in names if not (self.dir / n).is_file()]
            if missing:
                raise DataError(f"{self.dir}: missing {', '.join(missing)}")
            return {n: restricted_loads((self.dir / n).read_bytes(), str(self.dir / n)) for n in names}
        wanted = {f"{self.folder}/{n}": n for n in names}
        found = {}
        try:
            with tarfile.open(self.tar, "r:gz") as tar:
                for member in tar:  # one pass over the stream; seeking back in a .tar.gz is slow
                    if member.name in wanted and member.isfile():
                        found[wanted[member.name]] = tar.extractfile(member).read()
        except (OSError, EOFError, tarfile.TarError) as err:
            raise DataError(f"{self.tar}: cannot read archive ({type(err).__name__}: {err})") from None
        missing = [m for m, n in wanted.items() if n not in found]
        if missing:
            raise DataError(f"{self.tar}: archive lacks {', '.join(missing)}")
        return {n: restricted_loads(found[n], f"{self.tar}:{self.folder}/{n}") for n in names}


def _batch_arrays(batch: Any, label_key: str, source: str) -> tuple[np.ndarray, np.ndarray]:
    if not isinstance(batch, dict) or "data" not in batch or label_key not in batch:
        keys = sorted(batch) if isinstance(batch, dict) else type(batch).__name__
        raise DataError(f"{source}: expected a dict with 'data' and {label_key!r}, got {keys}")
    data, labels = batch["data"], np.asarray(batch[label_key], dtype=np.int64)
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        got = f"{data.dtype} {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataError(f"{source}: 'data' must be a uint8 array (N, 3072), got {got}")
    if labels.shape != (len(data),):
        raise DataError(f"{source}: {len(data)} images but {labels.shape} {label_key}")
    return data, labels


def load_cifar(
    root: Path, split: str, *, name: str, archive: str, folder: str, batches: dict[str, list[str]],
    meta: str, label_key: str, names_key: str, mean: tuple[float, ...], std: tuple[float, ...],
) -> TensorDataset:  # fmt: skip
    """One split of a CIFAR release: uint8 images ``(N, 3, 32, 32)`` and int64 labels ``(N,)``."""
    source = _Archive(root, archive, folder, meta)
    members = source.read(batches[split] + [meta])
    classes = members[meta].get(names_key) if isinstance(members[meta], dict) else None
    if not isinstance(classes, list) or not all(isinstance(c, str) for c in classes):
        raise DataError(f"{root}: meta file {meta!r} lacks the class names {names_key!r}")
    arrays = [_batch_arrays(members[b], label_key, f"{root}:{b}") for b in batches[split]]
    data = np.concatenate([a[0] for a in arrays])
    labels = np.concatenate([a[1] for a in arrays])
    if len(labels) and (labels.min() < 0 or labels.max() >= len(classes)):
        raise DataError(f"{root}: {label_key} out of range [0, {len(classes)})")
    return TensorDataset(
        inputs=torch.from_numpy(data.reshape(-1, 3, 32, 32)),
        labels=torch.from_numpy(labels),
        classes=classes,
        mean=mean,
        std=std,
        name=name,
        default_augment=Augment(crop_padding=4, flip=True),
    )


@register_dataset(
    "cifar10",
    description="CIFAR-10: 60k 32x32 colour images of 10 classes (50k train / 10k test), python pickles",
    markers=("cifar-10-python.tar.gz", "cifar-10-batches-py", "batches.meta"),
    get="Get it with `kdcollapse data download cifar10`.",
)
def cifar10(root: Path, split: str) -> TensorDataset:
    """CIFAR-10 (Krizhevsky 2009); mean (0.4914, 0.4822, 0.4465), std (0.2470, 0.2435, 0.2616)."""
    return load_cifar(
        root, split, name="cifar10", archive="cifar-10-python.tar.gz", folder="cifar-10-batches-py",
        batches={"train": [f"data_batch_{i}" for i in range(1, 6)], "test": ["test_batch"]},
        meta="batches.meta", label_key="labels", names_key="label_names",
        mean=(0.4914, 0.4822, 0.4465), std=(0.2470, 0.2435, 0.2616),
    )  # fmt: skip


@register_dataset(
    "cifar100",
    description="CIFAR-100: 60k 32x32 colour images of 100 classes (50k train / 10k test), python pickles",
    markers=("cifar-100-python.tar.gz", "cifar-100-python", "meta"),
    get="Get it with `kdcollapse data download cifar100`.",
)
def cifar100(root: Path, split: str) -> TensorDataset:
    """CIFAR-100 with its 100 fine labels; mean (0.5071, 0.4865, 0.4409), std (0.2673, 0.2564, 0.2762)."""
    return load_cifar(
        root, split, name="cifar100", archive="cifar-100-python.tar.gz", folder="cifar-100-python",
        batches={"train": ["train"], "test": ["test"]},
        meta="meta", label_key="fine_labels", names_key="fine_label_names",
        mean=(0.5071, 0.4865, 0.4409), std=(0.2673, 0.2564, 0.2762),
    )  # fmt: skip
