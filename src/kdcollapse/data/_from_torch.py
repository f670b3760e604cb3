"""A user's torch ``Dataset`` or ``DataLoader`` as a :class:`TensorDataset`, read once into memory.

The loader keeps a whole split as tensors on the device and augments it in batches there; a user's data
joins that path by being iterated once and stacked: uint8 images stay uint8, floating-point inputs become
float32. Everything is checked on the way in, so a bad item is named by its position.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, IterableDataset

from kdcollapse.data._dataset import TensorDataset
from kdcollapse.data._folder import FolderDataset
from kdcollapse.errors import DataError

USER_DATA = "user"  # data.name of a run whose data was passed from Python, not loaded by a registered name
DEFAULT_MAX_BYTES = 8 * 2**30  # the largest stacked split from_torch builds unless told otherwise
IDENTITY = {"mean": (0.0,), "std": (1.0,)}  # inputs fed as they are (uint8 images scaled to [0, 1])


def from_torch(
    data: Any,
    *,
    name: str = USER_DATA,
    num_classes: int | None = None,
    classes: Sequence[str] | None = None,
    mean: Sequence[float] | None = None,
    std: Sequence[float] | None = None,
    max_bytes: int = DEFAULT_MAX_BYTES,
) -> TensorDataset:
    """Iterate ``data`` once and stack it into a :class:`TensorDataset`.

    ``data``: a ``torch.utils.data.Dataset`` (map-style or iterable) yielding ``(x, y)`` items, or a
    ``DataLoader`` yielding batches of them. ``x``: a tensor or numpy array, an image ``(C, H, W)`` or
    ``(H, W)`` (uint8 0..255, or floating point in [0, 1]) or a feature vector ``(D,)``; ``y``: an integer
    label >= 0. Classes: ``classes`` (names), else ``num_classes``, else the data's ``classes``
    attribute, else the largest label + 1. ``mean`` / ``std``: the per-channel (per-feature for vectors)
    standardisation the loader applies, in [0, 1] units for images; computed from the data when not
    given (a constant channel gets std 1); ``mean=(0.0,), std=(1.0,)`` feeds the inputs as they are.
    ``max_bytes`` caps the stacked inputs. Raises a one-line ``DataError`` for anything else.
    """
    if (mean is None) != (std is None):
        raise DataError(f"{name}: give both mean and std, or neither (then they are computed from the data)")
    if not isinstance(max_bytes, int) or max_bytes < 1:
        raise DataError(f"{name}: max_bytes must be a positive int, got {max_bytes!r}")
    inputs, labels = _stack(data, name, max_bytes)
    names = _class_names(data, name, labels, num_classes, classes)
    if mean is None:
        mean, std = input_statistics(inputs)
    return TensorDataset(inputs, labels, names, tuple(map(float, mean)), tuple(map(float, std)), name)


def as_dataset(data: Any, **options: Any) -> TensorDataset | FolderDataset:
    """``data`` itself if it is a kdcollapse dataset, else :func:`from_torch` ``(data, **options)``."""
    if isinstance(data, (TensorDataset, FolderDataset)):
        return data
    return from_torch(data, **options)


def data_fingerprint(dataset: TensorDataset | FolderDataset) -> dict:
    """What identifies a split's data: its size, input shape and type, classes, normalisation and the
    SHA-256 of its inputs and labels (of its file paths and labels for a folder dataset)."""
    digest = hashlib.sha256()
    if isinstance(dataset, FolderDataset):
        digest.update(json.dumps(dataset.samples).encode())
        dtype = "files"
    else:
        for tensor in (dataset.inputs, dataset.labels):
            digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        dtype = str(dataset.inputs.dtype).removeprefix("torch.")
    return {"samples": len(dataset), "input_shape": list(dataset.input_shape), "dtype": dtype,
            "classes": list(dataset.classes), "mean": list(dataset.mean), "std": list(dataset.std),
            "sha256": digest.hexdigest()}


def input_statistics(inputs: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel (images, in [0, 1] units) or per-feature (vectors) mean and standard deviation, in
    float64 over chunks; a constant channel gets std 1."""
    scale = 255.0 if inputs.dtype == torch.uint8 else 1.0
    dims = (0, 2, 3) if inputs.ndim == 4 else (0,)
    total = torch.zeros(inputs.shape[1], dtype=torch.float64)
    squares = torch.zeros_like(total)
    for chunk in inputs.split(4096):
        chunk = chunk.double() / scale
        total += chunk.sum(dims)
        squares += chunk.square().sum(dims)
    count = inputs.numel() / inputs.shape[1]
    mean = total / count
    std = (squares / count - mean.square()).clamp_min(0).sqrt()
    std = torch.where(std > 1e-8, std, torch.ones_like(std))
    return tuple(mean.tolist()), tuple(std.tolist())


# --- reading ---------------------------------------------------------------------------------------


def _stack(data: Any, name: str, max_bytes: int) -> tuple[torch.Tensor, torch.Tensor]:
    xs, ys, first, used = [], [], None, 0
    for where, x, y in _chunks(data, name):
        if first is None:
            first = (where, x.shape[1:], x.dtype)
            expected = _expected_length(data)
            if expected is not None:
                _check_size(name, expected * x[0].numel() * x.element_size(), max_bytes)
        elif (x.shape[1:], x.dtype) != first[1:]:
            raise DataError(
                f"{name}: {first[0]} has inputs of shape {tuple(first[1])} ({first[2]}) but {where} has "
                f"{tuple(x.shape[1:])} ({x.dtype}); every input must have the same shape and type"
            )
        used += x.numel() * x.element_size()
        _check_size(name, used, max_bytes)
        xs.append(x)
        ys.append(y)
    if first is None:
        raise DataError(f"{name}: the data is empty (it yielded no items)")
    inputs = torch.cat(xs)
    if inputs.is_floating_point():
        bad = (~torch.isfinite(inputs.flatten(1))).any(1).nonzero().flatten()
        if len(bad):
            raise DataError(f"{name}: sample {int(bad[0])} (and {len(bad) - 1} more) has NaN or infinite inputs")
        if inputs.dim() >= 3 and (inputs.min() < 0 or inputs.max() > 1):  # images; vectors may take any value
            raise DataError(f"{name}: floating-point images must lie in [0, 1], got values in "
                            f"[{inputs.min().item():.4g}, {inputs.max().item():.4g}]; give uint8 images (0..255) "
                            "or divide by 255")
    return inputs, torch.cat(ys)


def _chunks(data: Any, name: str) -> Iterator[tuple[str, torch.Tensor, torch.Tensor]]:
    """``(where, x, y)`` with a leading batch dimension: a DataLoader's batches, or a Dataset's items."""
    if isinstance(data, DataLoader) and data.batch_sampler is not None:
        for b, batch in enumerate(data):
            yield (f"batch {b}", *_pair(batch, name, f"batch {b}", batched=True))
        return
    if isinstance(data, (DataLoader, IterableDataset)):
        items = iter(data)
    elif hasattr(data, "__getitem__") and hasattr(data, "__len__"):
        items = (data[i] for i in range(len(data)))
    else:
        raise DataError(f"{name}: expected a torch Dataset or DataLoader yielding (x, y) pairs, "
                        f"got {type(data).__name__}")
    for i, item in enumerate(items):
        yield (f"item {i}", *_pair(item, name, f"item {i}", batched=False))


def _pair(item: Any, name: str, where: str, *, batched: bool) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(item, (tuple, list)) or len(item) != 2:
        what = f"a {type(item).__name__}" + (f" of length {len(item)}" if isinstance(item, (tuple, list)) else "")
        raise DataError(f"{name}: {where} is {what}; each item must be an (x, y) pair of an input and a label")
    x, y = _as_tensor(item[0], name, where, "input"), _as_tensor(item[1], name, where, "label")
    if not batched:
        x, y = x[None], y.reshape(1) if y.numel() == 1 else y[None]
    return _inputs(x, name, where), _labels(y, len(x), name, where)


def _as_tensor(value: Any, name: str, where: str, what: str) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (np.ndarray, np.generic, int, float)) and not isinstance(value, bool):
        return torch.as_tensor(np.asarray(value))
    if isinstance(value, list) and what == "label":
        return torch.as_tensor(value)
    raise DataError(f"{name}: the {what} of {where} is a {type(value).__name__}; give a tensor or numpy array")


def _inputs(x: torch.Tensor, name: str, where: str) -> torch.Tensor:
    """``(B, C, H, W)`` uint8 or float32 images, or ``(B, D)`` float32 vectors."""
    if x.dtype != torch.uint8 and not x.is_floating_point():
        raise DataError(f"{name}: {where} has {x.dtype} inputs; images must be uint8 (0..255) or floating point "
                        "(in [0, 1]), vectors floating point")
    if x.ndim == 3:  # (H, W) grey images
        x = x[:, None]
    if x.ndim not in (2, 4):
        raise DataError(f"{name}: {where} has inputs of shape {tuple(x.shape[1:])}; expected an image (C, H, W) "
                        "or (H, W), or a vector (D,)")
    return x if x.dtype == torch.uint8 and x.ndim == 4 else x.float()


def _labels(y: torch.Tensor, count: int, name: str, where: str) -> torch.Tensor:
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise DataError(f"{name}: {where} has {y.dtype} labels; labels must be integers >= 0")
    if y.shape != (count,):
        raise DataError(f"{name}: {where} has labels of shape {tuple(y.shape)} for {count} inputs; give one "
                        "integer label per input")
    if len(y) and int(y.min()) < 0:
        raise DataError(f"{name}: {where} has the label {int(y.min())}; labels must be integers >= 0")
    return y.long()


def _expected_length(data: Any) -> int | None:
    source = data.dataset if isinstance(data, DataLoader) else data
    try:
        return len(source)
    except TypeError:
        return None


def _check_size(name: str, size: int, max_bytes: int) -> None:
    if size > max_bytes:
        raise DataError(
            f"{name}: the inputs need {size / 2**30:.2f} GiB in memory, more than max_bytes={max_bytes} "
            f"({max_bytes / 2**30:.2f} GiB); raise max_bytes, or keep the images in files and use an image-folder "
            "dataset (see docs/data.md)"
        )


def _class_names(data: Any, name: str, labels: torch.Tensor, num_classes: int | None,
                 classes: Sequence[str] | None) -> list[str]:
    """The class names: given, numbered ``0..num_classes-1``, the data's ``classes``, or numbered up to the
    largest label."""
    if classes is None and num_classes is None:
        found = getattr(data.dataset if isinstance(data, DataLoader) else data, "classes", None)
        if isinstance(found, (list, tuple)) and found and all(isinstance(c, str) for c in found):
            classes = found
    if classes is not None:
        classes = [str(c) for c in classes]
        if num_classes is not None and num_classes != len(classes):
            raise DataError(f"{name}: num_classes={num_classes} but {len(classes)} class names were given")
    elif num_classes is not None:
        if not isinstance(num_classes, int) or num_classes < 1:
            raise DataError(f"{name}: num_classes must be a positive int, got {num_classes!r}")
        classes = [str(k) for k in range(num_classes)]
    else:
        classes = [str(k) for k in range(int(labels.max()) + 1)]
    if int(labels.max()) >= len(classes):
        raise DataError(f"{name}: the labels reach {int(labels.max())} but there are {len(classes)} classes; "
                        f"labels must lie in [0, {len(classes)}) (pass num_classes or classes)")
    return classes
