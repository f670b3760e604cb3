"""Input validation shared by the losses (the selection of samples is in ``_reduce``).

Every check that needs a value from the device (finiteness, label range, an empty mask) is gathered
into one tensor and read back once, so validating a loss call costs one host synchronisation (two for
``ikl_loss`` with a class-weight table).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError


def check_tensor(name: str, x: object, ndims: tuple[int, ...], allow_empty: bool = False) -> Tensor:
    """``x`` is a floating tensor with one of ``ndims`` dimensions, non-empty unless allowed."""
    if not isinstance(x, Tensor):
        raise KdcollapseError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.dim() not in ndims:
        dims = " or ".join(str(n) for n in ndims)
        raise KdcollapseError(f"{name} must have {dims} dimensions, got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise KdcollapseError(f"{name} must be a floating-point tensor, got dtype {x.dtype}")
    if x.numel() == 0 and not allow_empty:
        raise KdcollapseError(f"{name} is empty (shape {tuple(x.shape)})")
    return x


def describe(x: object) -> str:
    """dtype and shape of a tensor, the type name of anything else (for error messages)."""
    return f"{x.dtype} {tuple(x.shape)}" if isinstance(x, Tensor) else type(x).__name__


def check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise KdcollapseError(f"{name} must be > 0, got {value}")


def check_values(named: Mapping[str, Tensor], target: Tensor | None = None, num_classes: int = 0,
                 keep: Tensor | None = None, mask: Tensor | None = None) -> bool:
    """One device read-back: every tensor in ``named`` finite, ``target`` in [0, num_classes) where
    ``keep`` (bool, the positions that count) is set, an integer ``mask`` all 0/1, and ``keep``
    selecting at least one position. Returns whether ``keep`` selects every position.

    Finiteness is read off one sum per tensor (a NaN or inf anywhere makes the sum NaN or inf),
    which is a single pass without a temporary, several times cheaper than ``isfinite(x).all()``;
    a sum that is non-finite only through overflow is re-checked element by element.
    """
    flags = [torch.isfinite(x.detach().sum()) for x in named.values()]
    messages = [f"{name} contains NaN or inf" for name in named]
    if target is not None:
        in_range = (target >= 0) & (target < num_classes)
        flags.append((in_range if keep is None else in_range | ~keep).all())
        messages.append(f"target has labels outside [0, {num_classes}) (K = {num_classes} classes)")
    if mask is not None and mask.dtype != torch.bool:
        flags.append(((mask == 0) | (mask == 1)).all())
        messages.append(f"mask of dtype {mask.dtype} must hold only 0 and 1")
    if keep is not None:
        flags.append(keep.any())
        if mask is None:
            messages.append("every label is ignore_index: no positions left")
        else:
            messages.append("mask selects no positions (every entry is False"
                            + (")" if target is None else " or labelled ignore_index)"))
        flags.append(keep.all())
    ok = torch.stack(flags).tolist()
    for i, x in enumerate(named.values()):
        ok[i] = ok[i] or bool(torch.isfinite(x).all())  # the sum of finite values may overflow
    bad = [message for message, fine in zip(messages, ok) if not fine]
    if bad:
        raise KdcollapseError("; ".join(bad))
    return keep is None or ok[-1]
