"""Input validation shared by the losses, and the flattening of (B, T, K) logits to samples.

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
                 mask: Tensor | None = None) -> None:
    """One device read-back: every tensor in ``named`` finite, ``target`` in [0, num_classes), and
    ``mask`` selecting at least one position.

    Finiteness is read off one sum per tensor (a NaN or inf anywhere makes the sum NaN or inf), which
    is a single pass without a temporary, several times cheaper than ``isfinite(x).all()``; a sum
    that is non-finite only through overflow is re-checked element by element.
    """
    flags = [torch.isfinite(x.detach().sum()) for x in named.values()]
    messages = [f"{name} contains NaN or inf" for name in named]
    if target is not None:
        flags.append(((target >= 0) & (target < num_classes)).all())
        messages.append(f"target has labels outside [0, {num_classes}) (K = {num_classes} classes)")
    if mask is not None:
        flags.append(mask.any())
        messages.append("mask selects no positions (every entry is False)")
    ok = torch.stack(flags).tolist()
    for i, x in enumerate(named.values()):
        ok[i] = ok[i] or bool(torch.isfinite(x).all())  # the sum of finite values may overflow
    bad = [message for message, fine in zip(messages, ok) if not fine]
    if bad:
        raise KdcollapseError("; ".join(bad))


def flatten_logits(named: Mapping[str, Tensor], target: Tensor | None = None,
                   mask: Tensor | None = None) -> tuple[list[Tensor], Tensor | None]:
    """Validate logits of shape (B, K) or (B, T, K) and return them as (N, K) samples.

    ``named`` maps argument names (used in error messages) to logits of one common shape. ``target``
    (integer labels) and ``mask`` (bool, True = use the position) have the logits' leading shape;
    every unmasked position is one sample, so N = B, B·T or ``mask.sum()``.
    """
    (first_name, first), *rest = named.items()
    check_tensor(first_name, first, (2, 3))
    lead, num_classes = tuple(first.shape[:-1]), first.shape[-1]
    for name, x in rest:
        check_tensor(name, x, (2, 3))
        if x.shape[:-1] == first.shape[:-1] and x.shape[-1] != num_classes:
            raise KdcollapseError(
                f"class counts differ: {first_name} has K = {num_classes} classes, "
                f"{name} has K = {x.shape[-1]}")
        if x.shape != first.shape:
            raise KdcollapseError(
                f"shapes differ: {first_name} {tuple(first.shape)} vs {name} {tuple(x.shape)}")
    if target is not None:
        if (not isinstance(target, Tensor) or target.dtype.is_floating_point
                or target.dtype == torch.bool):
            raise KdcollapseError(f"target must be an integer tensor of class indices, got "
                                  f"{describe(target)}")
        if tuple(target.shape) != lead:
            raise KdcollapseError(f"target must have shape {lead} to match the logits, "
                                  f"got {tuple(target.shape)}")
    if mask is not None:
        if not isinstance(mask, Tensor) or mask.dtype != torch.bool or tuple(mask.shape) != lead:
            raise KdcollapseError(f"mask must be a bool tensor of shape {lead}, got {describe(mask)}")
    check_values(named, target, num_classes, mask)
    if mask is None:
        flat = [x.reshape(-1, num_classes) for x in named.values()]
        return flat, None if target is None else target.reshape(-1)
    return [x[mask] for x in named.values()], None if target is None else target[mask]
