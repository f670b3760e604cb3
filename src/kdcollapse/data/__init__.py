"""Datasets as uint8 tensors, a seeded on-device loader with batched augmentation, and downloads.

``load_dataset(name, split, root=None)`` returns a :class:`TensorDataset` (a whole split in memory) or
a :class:`FolderDataset` (image files decoded by worker processes); ``make_loader`` turns either into
batches of normalised float tensors on a device; ``from_torch`` reads a user's torch ``Dataset`` or
``DataLoader`` once into a ``TensorDataset``. See ``docs/data.md``.
"""

from __future__ import annotations

from kdcollapse.data._dataset import (
    SPLITS,
    Augment,
    TensorDataset,
    dataset_entry,
    dataset_options,
    derive_seed,
    find_root,
    list_datasets,
    load_dataset,
    register_dataset,
    search_paths,
    split_validation,
)
from kdcollapse.data._download import NOT_DOWNLOADABLE, SOURCES, download_dataset, download_file, verify_file
from kdcollapse.data._folder import FolderDataset
from kdcollapse.data._from_torch import USER_DATA, as_dataset, data_fingerprint, from_torch
from kdcollapse.data._loader import Loader, augment_batch, make_loader

# Importing the dataset modules registers their datasets.
from kdcollapse.data import _cifar, _idx, _pairs, _synthetic  # noqa: E402,F401  isort: skip

__all__ = [
    "NOT_DOWNLOADABLE",
    "SOURCES",
    "SPLITS",
    "USER_DATA",
    "Augment",
    "FolderDataset",
    "Loader",
    "TensorDataset",
    "as_dataset",
    "augment_batch",
    "data_fingerprint",
    "dataset_entry",
    "dataset_options",
    "derive_seed",
    "download_dataset",
    "download_file",
    "find_root",
    "from_torch",
    "list_datasets",
    "load_dataset",
    "make_loader",
    "register_dataset",
    "search_paths",
    "split_validation",
    "verify_file",
]
