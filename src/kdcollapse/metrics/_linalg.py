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
    a = matrix.to(torch.float64)
    if not torch.isfinite(a).all():
        raise KdcollapseError(f"psd_pinv: the {n}x{n} matrix holds NaN or inf (features with NaN or inf?)")
    eigenvalues, eigenvectors = torch.linalg.eigh((a + a.mT) / 2)  # ascending order
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


# Rows of a float32 K x d matrix widened to float64 at a time (float32 accumulation, ``FeatureStatistics``):
# 8192 x 4096 float64 = 256 MiB; no K x d float64 copy is made.
CHUNK_ROWS = 8192


def cross_gram(a: Tensor, b: Tensor | None = None, weights: Tensor | None = None) -> Tensor:
    """sum_k w_k a_k b_k^T (d x d, float64) of the rows of ``a`` and ``b`` (K x d; b = a, w_k = 1 by default).
    Float64 rows: one product. Float32 rows (the K x d states of float32 accumulation) are widened
    ``CHUNK_ROWS`` at a time and the products summed in float64."""
    b = a if b is None else b
    if a.dtype == torch.float64 and b.dtype == torch.float64:
        return (a if weights is None else a * weights[:, None]).mT @ b
    out = torch.zeros(a.shape[1], b.shape[1], dtype=torch.float64, device=a.device)
    for start in range(0, a.shape[0], CHUNK_ROWS):
        rows = slice(start, start + CHUNK_ROWS)
        left = a[rows].double() if weights is None else a[rows].double() * weights[rows, None]
        out += left.mT @ b[rows].double()
    return out


def weighted_sum(a: Tensor, weights: Tensor) -> Tensor:
    """sum_k w_k a_k (d, float64) of the rows of ``a`` (K x d, float64 or float32; see ``cross_gram``)."""
    if a.dtype == torch.float64:
        return weights @ a
    return sum((weights[start:start + CHUNK_ROWS] @ a[start:start + CHUNK_ROWS].double()
                for start in range(0, a.shape[0], CHUNK_ROWS)), torch.zeros(a.shape[1], dtype=torch.float64,
                                                                           device=a.device))


def quadratic_forms(a: Tensor, matrix: Tensor) -> Tensor:
    """a_k^T M a_k for every row of ``a`` (K, float64); M a float64 d x d matrix."""
    if a.dtype == torch.float64:
        return ((a @ matrix) * a).sum(1)
    return torch.cat([((rows.double() @ matrix) * rows.double()).sum(1) for rows in a.split(CHUNK_ROWS)])
