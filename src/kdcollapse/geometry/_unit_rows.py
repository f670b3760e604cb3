"""The rows of a classifier W as unit vectors, validated, without a (K, d) float64 copy of W: W as given (float64,
or float32 as under float32 accumulation), its float64 row norms and one float32 copy of the unit rows for
screening; float64 unit rows are formed per block of rows, ``_CHUNK_ENTRIES`` entries at a time."""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError

_CHUNK_ENTRIES = 2**24  # rows of W widened to float64 at a time: 128 MiB whatever d


def _checked(W: Tensor, name: str) -> tuple[Tensor, Tensor]:
    """Validate a (K, d) matrix of class vectors; return it (detached; float32 stays float32, any other dtype
    becomes float64) and its float64 row norms, computed ``_CHUNK_ENTRIES`` entries at a time.

    Raises ``KdcollapseError`` for a wrong shape, fewer than two rows, NaN/inf entries or zero rows.
    """
    if not isinstance(W, Tensor):
        W = torch.as_tensor(W)
    if W.ndim != 2:
        raise KdcollapseError(f"{name} must be a (K, d) matrix of class vectors, got shape {tuple(W.shape)}")
    if W.shape[0] < 2 or W.shape[1] < 1:
        raise KdcollapseError(f"{name} needs at least 2 classes (rows) and 1 dimension, got shape {tuple(W.shape)}")
    if W.is_complex():
        raise KdcollapseError(f"{name} must be real, got dtype {W.dtype}")
    W = W.detach()
    W = W if W.dtype == torch.float32 else W.to(torch.float64)
    norms, finite = W.new_empty(W.shape[0], dtype=torch.float64), W.new_empty(W.shape[0], dtype=torch.bool)
    for rows in _chunks(W.shape[0], W.shape[1]):
        block = W[rows].to(torch.float64)
        norms[rows], finite[rows] = block.norm(dim=1), torch.isfinite(block).all(1)
    bad = (~finite).nonzero().flatten()
    if len(bad):
        raise KdcollapseError(f"{name} has NaN or infinite entries in rows {bad[:10].tolist()}")
    zero = (norms == 0).nonzero().flatten()
    if len(zero):
        raise KdcollapseError(f"{name} has zero rows {zero[:10].tolist()}, which have no direction")
    return W, norms


def _chunks(num_rows: int, dim: int) -> list[slice]:
    """Row ranges of at most ``_CHUNK_ENTRIES`` entries (slices: W's rows are views, not gathered copies)."""
    step = max(1, _CHUNK_ENTRIES // max(dim, 1))
    return [slice(start, min(start + step, num_rows)) for start in range(0, num_rows, step)]


def unit_rows(W: Tensor, name: str = "W") -> Tensor:
    """Validate a (K, d) matrix of class vectors and return its rows normalised, in float64.

    Raises ``KdcollapseError`` for a wrong shape, fewer than two rows, NaN/inf entries or zero rows.
    """
    W, norms = _checked(W, name)
    return W.to(torch.float64) / norms[:, None]


class _UnitRows:
    """The rows of W normalised, without a (K, d) float64 copy: W as given (float64, or float32), its float64
    norms, and the float32 unit rows the screening uses. ``gather`` and ``scores`` form float64 unit rows on
    the fly; for a float64 W they equal ``unit_rows(W)``'s rows exactly."""

    def __init__(self, W: Tensor, name: str = "W"):
        self.W, self.norms = _checked(W, name)
        self.shape = self.W.shape
        self.device = self.W.device
        self.W32 = torch.empty(self.shape, dtype=torch.float32, device=self.device)
        for rows in _chunks(*self.shape):
            self.W32[rows] = self.gather(rows).float()

    def gather(self, index: Tensor) -> Tensor:
        """Float64 unit rows ``index`` (any shape of indices; the result has a trailing d)."""
        out = self.W[index].to(torch.float64)
        if isinstance(index, slice) and self.W.dtype == torch.float64:  # a view of W: not to be divided in place
            return out / self.norms[index][..., None]
        return out.div_(self.norms[index][..., None])  # a fresh copy (gathered or widened)

    def scores(self, y: Tensor) -> Tensor:
        """``y @ U.T`` (b, K) for float64 ``y`` (b, d), U the unit rows, a chunk of rows of W at a time."""
        out = y.new_empty(y.shape[0], self.shape[0])
        for rows in _chunks(*self.shape):
            out[:, rows] = y @ self.gather(rows).mT
        return out
