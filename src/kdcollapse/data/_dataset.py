"""In-memory datasets, the dataset registry and the search for files on disk."""

from __future__ import annotations

import dataclasses
import inspect
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import numpy as np
import torch

from kdcollapse._registry import Registry
from kdcollapse.errors import DataError, unknown_choice

SPLITS = ("train", "test")
D = TypeVar("D")  # a TensorDataset or a FolderDataset


class SplitDataset(Protocol):
    """What the loaders, the trainer and the reports read of a loaded split: a :class:`TensorDataset`, the
    image-folder datasets' ``FolderDataset`` (decoded on demand), or a registered dataset's own class."""

    name: str
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    labels: torch.Tensor
    default_augment: Augment

    @property
    def num_classes(self) -> int: ...

    @property
    def in_channels(self) -> int: ...

    def __len__(self) -> int: ...


def derive_seed(*keys: int) -> int:
    """A 64-bit seed that is a pure function of non-negative ints, e.g. ``(seed, epoch)``.

    Nearby keys give unrelated seeds (numpy's ``SeedSequence`` hashing), so epoch 1's stream shares
    nothing with epoch 0's.
    """
    if not all(isinstance(k, int) and k >= 0 for k in keys):
        raise DataError(f"seeds must be non-negative ints, got {keys}")
    return int(np.random.SeedSequence(list(keys)).generate_state(1, np.uint64)[0])


@dataclass(frozen=True)
class Augment:
    """Training augmentation applied in batches on the device (see ``kdcollapse.data.augment_batch``).

    ``crop_padding``: pad each image with ``crop_padding`` zero pixels on every side, then take a random
    crop of the original size (the usual CIFAR recipe uses 4). ``flip``: mirror left-right with
    probability 1/2.
    """

    crop_padding: int = 0
    flip: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.crop_padding, int) or self.crop_padding < 0:
            raise DataError(f"Augment.crop_padding must be an int >= 0, got {self.crop_padding!r}")

    @property
    def active(self) -> bool:
        return self.crop_padding > 0 or self.flip


@dataclass
class TensorDataset:
    """A whole split held as tensors.

    ``inputs``: ``(N, C, H, W)`` images, uint8 (0..255) or float32 (in [0, 1]), or float32 ``(N, D)``
    vectors; ``labels``: int64 ``(N,)``
    in ``[0, num_classes)``; ``mean`` / ``std``: per-channel normalisation in [0, 1] units (one value
    broadcasts over all channels; vector data uses ``(0.0,)`` / ``(1.0,)``, i.e. no normalisation);
    ``default_augment``: what ``make_loader(train=True)`` applies when given ``augment=None``;
    ``superclasses`` / ``superclass``: optional coarser groups, their names and each class's group index
    (``fashion_mnist_pairs``: the left item).
    """

    inputs: torch.Tensor
    labels: torch.Tensor
    classes: list[str]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    name: str
    default_augment: Augment = field(default_factory=Augment)
    superclasses: list[str] | None = None
    superclass: list[int] | None = None

    def __post_init__(self) -> None:
        x, y = self.inputs, self.labels
        if not (x.dtype in (torch.uint8, torch.float32) and x.ndim == 4) and not (x.dtype == torch.float32
                                                                                  and x.ndim == 2):
            raise DataError(
                f"{self.name}: inputs must be uint8 or float32 (N, C, H, W), or float32 (N, D), "
                f"got {x.dtype} {tuple(x.shape)}"
            )
        if y.dtype != torch.int64 or y.shape != (x.shape[0],):
            raise DataError(
                f"{self.name}: labels must be int64 of shape ({x.shape[0]},), got {y.dtype} {tuple(y.shape)}"
            )
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= len(self.classes)):
            raise DataError(
                f"{self.name}: labels must lie in [0, {len(self.classes)}), "
                f"got range [{int(y.min())}, {int(y.max())}]"
            )
        _check_mean_std(self.name, self.mean, self.std, self.in_channels)
        _check_superclasses(self.name, self.superclasses, self.superclass, len(self.classes))

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def input_shape(self) -> tuple[int, ...]:
        """``(C, H, W)`` for images, ``(D,)`` for vectors."""
        return tuple(self.inputs.shape[1:])

    @property
    def full_scale(self) -> float:
        """The stored value that means 1.0: 255 for uint8 images, else 1."""
        return 255.0 if self.inputs.dtype == torch.uint8 else 1.0

    @property
    def in_channels(self) -> int:
        """``C`` for images, ``D`` for vectors (the input width a model is built for)."""
        return self.inputs.shape[1]

    def __len__(self) -> int:
        return self.inputs.shape[0]

    def subset(
        self,
        n_per_class: int | None = None,
        *,
        indices: Sequence[int] | torch.Tensor | None = None,
        seed: int = 0,
    ) -> TensorDataset:
        """A new dataset of ``n_per_class`` samples of every class (drawn with ``seed``), or of ``indices``.

        The chosen samples keep their original order. Raises ``DataError`` if a class has fewer than
        ``n_per_class`` samples or an index is out of range.
        """
        index = select_subset(self.labels, self.num_classes, self.name, n_per_class, indices, seed)
        return dataclasses.replace(self, inputs=self.inputs[index], labels=self.labels[index])

    def select_classes(self, classes: Sequence[int]) -> TensorDataset:
        """The samples of ``classes`` only, relabelled: class ``classes[i]`` becomes label ``i``.

        Order is kept; ``mean``/``std`` stay those of the whole dataset. E.g. Fashion-MNIST's
        ``select_classes([2, 4, 7, 9])`` is a 4-class dataset of pullovers, coats, sneakers and ankle boots.
        """
        index, labels, names = relabel_classes(self.labels, self.classes, self.name, classes)
        superclass = None if self.superclass is None else [self.superclass[int(c)] for c in classes]
        return dataclasses.replace(self, inputs=self.inputs[index], labels=labels, classes=names,
                                   superclass=superclass)


def relabel_classes(
    labels: torch.Tensor, class_names: list[str], name: str, classes: Sequence[int]
) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    """Rows of the samples of ``classes`` and their new labels: class ``classes[i]`` becomes label ``i``.

    Returns ``(index, new_labels, new_class_names)``; raises ``DataError`` for fewer than two classes,
    repeated classes or classes outside ``[0, len(class_names))``.
    """
    chosen = [int(c) for c in classes]
    num_classes = len(class_names)
    if len(chosen) < 2 or len(set(chosen)) != len(chosen) or not all(0 <= c < num_classes for c in chosen):
        raise DataError(
            f"{name}: classes must be at least two distinct class indices in [0, {num_classes}), got {chosen}; "
            f"the classes are " + ", ".join(f"{i} {c}" for i, c in enumerate(class_names))
        )
    new_label = torch.full((num_classes,), -1, dtype=torch.int64)
    new_label[chosen] = torch.arange(len(chosen))
    index = torch.nonzero(new_label[labels] >= 0).flatten()
    return index, new_label[labels[index]], [class_names[c] for c in chosen]


def select_subset(
    labels: torch.Tensor,
    num_classes: int,
    name: str,
    n_per_class: int | None,
    indices: Sequence[int] | torch.Tensor | None,
    seed: int,
) -> torch.Tensor:
    """Sorted int64 indices of a balanced random subset, or the validated ``indices``."""
    if (n_per_class is None) == (indices is None):
        raise DataError("subset() needs exactly one of n_per_class or indices")
    if indices is not None:
        index = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        if len(index) and (int(index.min()) < 0 or int(index.max()) >= len(labels)):
            raise DataError(f"{name}: subset indices must lie in [0, {len(labels)})")
        return index
    counts = torch.bincount(labels, minlength=num_classes)
    if n_per_class < 1 or int(counts.min()) < n_per_class:
        raise DataError(
            f"{name}: cannot take {n_per_class} samples per class; the smallest class has {int(counts.min())}"
        )
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(labels), generator=g)
    # A stable sort by label keeps the random order inside each class; take the first n of each.
    by_class = order[torch.sort(labels[order], stable=True).indices]
    starts = torch.cumsum(counts, 0) - counts
    picks = (starts[:, None] + torch.arange(n_per_class)).reshape(-1)
    return torch.sort(by_class[picks]).values


VAL_SPLIT_KEY = 0x76616C  # "val" in ASCII: the validation draw's key, far from any epoch number


def split_validation(dataset: D, val_per_class: int, seed: int) -> tuple[D, D | None]:
    """``(train, val)``: ``val_per_class`` samples of every class, drawn with ``derive_seed(seed,
    VAL_SPLIT_KEY)``, and every other sample; ``(dataset, None)`` when ``val_per_class`` is 0.

    The two are disjoint and both keep the original order; a training subset (``train_per_class``) is
    then drawn from ``train`` only. Raises ``DataError`` if a class would keep no training sample.
    """
    if not isinstance(val_per_class, int) or isinstance(val_per_class, bool) or val_per_class < 0:
        raise DataError(f"val_per_class must be an int >= 0, got {val_per_class!r}")
    if val_per_class == 0:
        return dataset, None
    counts = torch.bincount(dataset.labels, minlength=dataset.num_classes)
    if val_per_class >= int(counts.min()):
        raise DataError(
            f"{dataset.name}: val_per_class={val_per_class} leaves no training sample in the smallest class "
            f"({int(counts.min())} samples); use at most {int(counts.min()) - 1}"
        )
    val_index = select_subset(dataset.labels, dataset.num_classes, dataset.name, val_per_class, None,
                              derive_seed(seed, VAL_SPLIT_KEY))
    keep = torch.ones(len(dataset), dtype=torch.bool)
    keep[val_index] = False
    return dataset.subset(indices=torch.nonzero(keep).flatten()), dataset.subset(indices=val_index)


def _check_superclasses(name: str, names: list[str] | None, of_class: list[int] | None, num_classes: int) -> None:
    if (names is None) != (of_class is None):
        raise DataError(f"{name}: give both superclasses and superclass, or neither")
    if of_class is not None and (len(of_class) != num_classes or not all(0 <= g < len(names) for g in of_class)):
        raise DataError(f"{name}: superclass needs one index in [0, {len(names)}) per class ({num_classes})")


def _check_mean_std(name: str, mean: Sequence[float], std: Sequence[float], channels: int) -> None:
    if len(mean) not in (1, channels) or len(std) != len(mean):
        raise DataError(f"{name}: mean/std need 1 or {channels} values each, got {len(mean)} and {len(std)}")
    if any(s <= 0 for s in std):
        raise DataError(f"{name}: std must be positive, got {tuple(std)}")


# --- registry and search paths ---------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetEntry:
    """How to find and load one named dataset.

    ``load(root, split, **options)`` builds a split from the directory ``root`` (``None`` for datasets
    that need no files); ``markers`` are paths relative to a root, any of which shows the dataset is
    there; ``system_paths`` are searched after the standard places; ``get`` says how to obtain it;
    ``files_of`` names a dataset whose places are searched too (a dataset derived from its files).
    """

    name: str
    load: Callable[..., Any]
    description: str
    markers: tuple[str, ...] = ()
    system_paths: tuple[str, ...] = ()
    get: str = ""
    files_of: str = ""
    reads_files: bool = True  # False: built from nothing on disk (a root given for it is an error)

    @property
    def needs_files(self) -> bool:
        return bool(self.markers)


_DATASETS: Registry[DatasetEntry] = Registry("dataset")


def register_dataset(
    name: str,
    *,
    description: str,
    markers: Sequence[str] = (),
    system_paths: Sequence[str] = (),
    get: str = "",
    files_of: str = "",
    reads_files: bool = True,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Register ``load(root, split, **options)`` under ``name`` (decorator); ``reads_files=False``: the
    dataset reads nothing from disk, so a ``root`` given for it is refused rather than ignored."""

    def decorator(load: Callable[..., Any]) -> Callable[..., Any]:
        entry = DatasetEntry(name, load, description, tuple(markers), tuple(system_paths), get, files_of,
                             reads_files)
        _DATASETS.register(name)(entry)
        return load

    return decorator


def dataset_entry(name: str) -> DatasetEntry:
    """The registered entry; ``DataError`` listing the valid names for an unknown one."""
    if name not in _DATASETS:
        raise DataError(unknown_choice("dataset", name, _DATASETS.names()))
    return _DATASETS.get(name)


def list_datasets(pattern: str = "*") -> list[str]:
    """Sorted registered dataset names matching a shell-style pattern."""
    return _DATASETS.names(pattern)


def search_paths(name: str) -> list[Path]:
    """Where ``root=None`` looks for ``name``, in order."""
    entry = dataset_entry(name)
    paths = []
    if os.environ.get("KDCOLLAPSE_DATA"):
        paths.append(Path(os.environ["KDCOLLAPSE_DATA"]) / name)
    paths += [Path.cwd() / "data" / name, Path.home() / ".cache" / "kdcollapse" / name]
    paths += [Path(p) for p in entry.system_paths]
    if entry.files_of:
        paths += [p for p in search_paths(entry.files_of) if p not in paths]
    return paths


def default_download_root(name: str) -> Path:
    """``$KDCOLLAPSE_DATA/<name>`` if set, else ``~/.cache/kdcollapse/<name>``."""
    base = os.environ.get("KDCOLLAPSE_DATA")
    return Path(base) / name if base else Path.home() / ".cache" / "kdcollapse" / name


def has_files(entry: DatasetEntry, root: Path) -> bool:
    return any((root / marker).exists() for marker in entry.markers)


def find_root(name: str, root: str | os.PathLike | None = None) -> Path | None:
    """The folder holding ``name`` (``root`` itself if given); ``DataError`` naming every place tried."""
    entry = dataset_entry(name)
    if not entry.needs_files:
        if root is not None and not entry.reads_files:
            raise DataError(f"dataset {name!r} reads no files (it is built in), so root {str(root)!r} would be "
                            "ignored: drop data.root (or --root)")
        return None if root is None else Path(root).expanduser()
    candidates = [Path(root).expanduser()] if root is not None else search_paths(name)
    for candidate in candidates:
        if has_files(entry, candidate):
            return candidate
    looked = ", ".join(str(p) for p in candidates)
    expected = " or ".join(entry.markers)
    raise DataError(f"dataset {name!r} not found (expected {expected}); looked in {looked}. {entry.get}")


def load_dataset(
    name: str, split: str, root: str | os.PathLike | None = None, **options: Any
) -> SplitDataset:
    """Load split ``"train"`` or ``"test"`` of the registered dataset ``name``.

    Returns a :class:`TensorDataset` (or a ``FolderDataset`` for image-folder datasets). ``root=None``
    searches ``$KDCOLLAPSE_DATA/<name>``, ``./data/<name>``, ``~/.cache/kdcollapse/<name>`` and the
    dataset's system paths; ``options`` go to the dataset (e.g. ``gaussian_mixture``'s ``dim``).
    """
    entry = dataset_entry(name)
    if split not in SPLITS:
        raise DataError(unknown_choice("split", split, SPLITS))
    valid = dataset_options(name)
    for key in options:
        if key not in valid:
            raise DataError(unknown_choice(f"option of dataset {name!r}", key, valid))
    return entry.load(find_root(name, root), split, **options)


def dataset_options(name: str) -> dict[str, Any]:
    """The keyword options ``load_dataset(name, ...)`` accepts, with their defaults."""
    params = list(inspect.signature(dataset_entry(name).load).parameters.values())[2:]
    return {p.name: p.default for p in params}
