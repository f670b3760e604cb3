"""Pseudo-inverse of a symmetric positive semi-definite matrix, with the rank it used."""

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
