"""Pseudo-inverse of a symmetric positive semi-definite matrix, with the rank it used; float64 Grams and sums of
the rows of K x d matrices that may be float32 (float32 accumulation), without a float64 copy."""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError


def psd_pinv(matrix: Tensor, *, rtol: float | None = None, rank: int | None = None) -> tuple[Tensor, int]:
    """Moore-Penrose pseudo-inverse of a symmetric PSD ``(n, n)`` matrix, and the rank it kept.

    ``eigh`` in float64; eigenvalues at or below ``rtol * lambda_max`` are treated as zero
    (default ``rtol = n * eps`` of ``matrix.dtype``). With an explicit ``rank`` the ``rank`` largest
    eigenvalues are kept instead. Covariance matrices such as Sigma_B are singular by construction
    (rank <= K - 1); rounding fills their null space with tiny eigenvalues, and inverting those is what
    makes naive NC1 values wrong by orders of magnitude (VCI paper, Sec. 4.3).

    >>> A = torch.tensor([[2.0, 0.0], [0.0, 1e-12]], dtype=torch.float64)
    >>> pinv, used = psd_pinv(A, rtol=1e-9)
    >>> pinv.diag().tolist(), used
    ([0.5, 0.0], 1)
    """
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise KdcollapseError(f"psd_pinv needs a square matrix, got shape {tuple(matrix.shape)}")
    n = matrix.shape[0]
    if rtol is None:
        rtol = n * torch.finfo(matrix.dtype).eps
    if not 0.0 <= rtol < 1.0:
        raise KdcollapseError(f"rtol must lie in [0, 1), got {rtol}")
    return pinv_from_eigh(*psd_eigh(matrix), rtol=rtol, rank=rank)


def psd_eigh(matrix: Tensor) -> tuple[Tensor, Tensor]:
    """Float64 eigenvalues (ascending) and eigenvectors of the symmetrised square ``matrix``, for
    ``pinv_from_eigh``: one decomposition serves several pseudo-inverses of the same matrix."""
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1]:
        raise KdcollapseError(f"psd_eigh needs a square matrix, got shape {tuple(matrix.shape)}")
    n = matrix.shape[0]
    a = matrix.to(torch.float64)
    if not torch.isfinite(a).all():
        raise KdcollapseError(f"psd_pinv: the {n}x{n} matrix holds NaN or inf (features with NaN or inf?)")
    return torch.linalg.eigh((a + a.mT) / 2)  # ascending order


def pinv_from_eigh(eigenvalues: Tensor, eigenvectors: Tensor, *, rtol: float,
                   rank: int | None = None) -> tuple[Tensor, int]:
    """``psd_pinv`` of the matrix whose ``psd_eigh`` is (``eigenvalues``, ``eigenvectors``); ``rtol`` already
    resolved (``psd_pinv``'s default is ``n * eps`` of the matrix's own dtype)."""
    n, a = eigenvalues.numel(), eigenvectors
    if rank is None:
        largest = eigenvalues[-1].clamp(min=0.0)
        keep = (eigenvalues > rtol * largest) & (eigenvalues > 0)
    else:
        if not 0 <= rank <= n:
            raise KdcollapseError(f"rank must lie in [0, {n}] for a {n}x{n} matrix, got {rank}")
        keep = torch.arange(n, device=a.device) >= n - rank
        if bool((eigenvalues[keep] <= 0).any()):
            raise KdcollapseError(f"rank={rank} keeps non-positive eigenvalues; the matrix has lower rank")
    vectors = eigenvectors[:, keep]
    return (vectors / eigenvalues[keep]) @ vectors.mT, int(keep.sum())


def symmetric_from_upper(matrix: Tensor) -> Tensor:
    """The symmetric matrix whose upper triangle (diagonal included) ``matrix`` holds."""
    upper = matrix.triu()
    return upper + upper.triu(1).mT


# Rows of a K x d matrix formed or widened to float64 at a time (float32 accumulation, ``LazyRows``):
# 8192 x 4096 float64 = 256 MiB; no K x d float64 copy is made.
CHUNK_ROWS = 8192


class LazyRows:
    """A K x d matrix that is never held whole: ``rows[a:b]`` forms rows a..b-1 on demand from ``get``.

    The metric phase derives its class means, their centred and normalised copies, ... from the K x d states;
    as ``LazyRows`` they cost ``CHUNK_ROWS`` (or one pairwise tile of) rows at a time instead of a K x d copy
    each (docs/metrics.md, "Peak memory bound"). ``get(slice)`` must be row-local: row k of the result
    depends on row k of the sources only, so chunked results equal the whole matrix's exactly."""

    def __init__(self, shape: tuple[int, int], dtype: torch.dtype, device: torch.device, get) -> None:
        self.shape, self.dtype, self.device, self.get = tuple(shape), dtype, device, get

    @classmethod
    def of(cls, matrix: Tensor | LazyRows) -> LazyRows:
        """``matrix`` itself if lazy, else its rows (views: no copy)."""
        if isinstance(matrix, LazyRows):
            return matrix
        return cls(matrix.shape, matrix.dtype, matrix.device, matrix.__getitem__)

    def __getitem__(self, rows: slice) -> Tensor:
        return self.get(rows)

    def map(self, fn) -> LazyRows:
        """The rows ``fn(rows)``; ``fn`` row-local, shape- and dtype-preserving."""
        return LazyRows(self.shape, self.dtype, self.device, lambda rows: fn(self.get(rows)))

    def chunks(self):
        """(slice, rows) of ``CHUNK_ROWS`` rows at a time."""
        for start in range(0, self.shape[0], CHUNK_ROWS):
            rows = slice(start, start + CHUNK_ROWS)
            yield rows, self.get(rows)

    def full(self) -> Tensor:
        """The whole K x d matrix (one copy: only where a caller needs it, e.g. NC4's class means)."""
        return self.get(slice(None))


Rows = Tensor | LazyRows


def _whole(*matrices: Rows) -> bool:
    """Whether every matrix is a float64 tensor: one product, no chunking (the dense path, as before)."""
    return all(isinstance(m, Tensor) and m.dtype == torch.float64 for m in matrices)


def _float64_chunks(*matrices: Rows):
    """(slice, float64 rows of each matrix) ``CHUNK_ROWS`` rows at a time."""
    num = matrices[0].shape[0]
    for start in range(0, num, CHUNK_ROWS):
        rows = slice(start, start + CHUNK_ROWS)
        yield rows, [m[rows].double() for m in matrices]


def cross_gram(a: Rows, b: Rows | None = None, weights: Tensor | None = None) -> Tensor:
    """sum_k w_k a_k b_k^T (d x d, float64) of the rows of ``a`` and ``b`` (K x d; b = a, w_k = 1 by default).
    Float64 tensors: one product. Float32 rows (the K x d states of float32 accumulation) and ``LazyRows`` are
    formed and widened ``CHUNK_ROWS`` at a time and the products summed in float64."""
    same = b is None
    b = a if same else b
    if _whole(a, b):
        return _gram(a if weights is None else a * weights[:, None], b, same)
    out = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64, device=a.device)
    for rows, (left, *right) in _float64_chunks(a, *(() if same else (b,))):
        right = right[0] if right else left
        out += _gram(left if weights is None else left * weights[rows, None], right, same)
    return out


GRAM_BLOCK = 1024  # columns per block of a symmetric Gram (only the blocks on and above the diagonal are formed)


def _gram(left: Tensor, right: Tensor, symmetric: bool) -> Tensor:
    """``left^T right``; when it is symmetric (``left`` is ``right`` with its rows weighted), only its blocks of
    ``GRAM_BLOCK`` columns on and above the diagonal are computed and the rest mirrored (10 of 16 block
    products at d = 4,096; 1.4x less CPU for a float64 chunk of 8,192 x 4,096 rows, one run, on the
    benchmarks' Intel Xeon, CPU capability AVX512)."""
    dim = left.shape[1]
    if not symmetric or dim <= GRAM_BLOCK:
        return left.mT @ right
    out = left.new_empty(dim, dim)
    starts = range(0, dim, GRAM_BLOCK)
    for i in starts:
        rows = slice(i, i + GRAM_BLOCK)
        out[rows, i:] = left[:, rows].mT @ right[:, i:]
        out[i + GRAM_BLOCK:, rows] = out[rows, i + GRAM_BLOCK:].mT
    return out


def weighted_sum(a: Rows, weights: Tensor) -> Tensor:
    """sum_k w_k a_k (d, float64) of the rows of ``a`` (K x d, float64 or float32; see ``cross_gram``)."""
    if _whole(a):
        return weights @ a
    return sum((weights[rows] @ left for rows, (left,) in _float64_chunks(a)),
               torch.zeros(a.shape[1], dtype=torch.float64, device=a.device))


def row_sum(a: Rows) -> Tensor:
    """sum_k a_k (d, float64) of the rows of ``a``."""
    if isinstance(a, Tensor):
        return a.sum(0, dtype=torch.float64)
    return sum((rows.sum(0, dtype=torch.float64) for _, rows in a.chunks()),
               torch.zeros(a.shape[1], dtype=torch.float64, device=a.device))


def per_row(a: Rows, fn) -> Tensor:
    """``fn(rows)`` (a per-row vector) for every row of ``a``, ``CHUNK_ROWS`` rows at a time: (K,)."""
    if isinstance(a, Tensor):
        return fn(a)
    return torch.cat([fn(rows) for _, rows in a.chunks()])


def row_dots(a: Rows, b: Rows) -> Tensor:
    """a_k . b_k (K, float64; products in the rows' dtype, summed in float64) for every row."""
    if isinstance(a, Tensor) and isinstance(b, Tensor):
        return (a * b).sum(1, dtype=torch.float64)
    b = LazyRows.of(b)
    return torch.cat([(left * b[rows]).sum(1, dtype=torch.float64) for rows, left in LazyRows.of(a).chunks()])


def quadratic_forms(a: Rows, matrix: Tensor) -> Tensor:
    """a_k^T M a_k for every row of ``a`` (K, float64); M a float64 d x d matrix."""
    if _whole(a):
        return ((a @ matrix) * a).sum(1)
    return torch.cat([((rows @ matrix) * rows).sum(1) for _, (rows,) in _float64_chunks(a)])
