"""Exact one-vs-rest distances of a classifier, with a duality certificate (GNC paper, Def. 2.1).

For unit class vectors w_1..w_K the one-vs-rest distance of class k is

    dist(w_k, conv{w_j : j != k}) = min_{lambda in simplex} || w_k - sum_j lambda_j w_j ||      (eq. 3)

a convex QP per class. Writing p_j = w_j - w_k and y = sum_j lambda_j p_j (= P(w_k) - w_k), it is the
minimum-norm point of the polytope conv{p_j}. Any feasible lambda gives an upper bound ||y||; any unit
direction h gives the lower bound min_j <w_k - w_j, h> (the separating-hyperplane dual of Lemma C.6,
whose optimum is the distance itself). With h = -y/||y|| the two bounds differ by

    gap = ||y|| - min_j <p_j, y> / ||y||  =  (Frank-Wolfe duality gap of ||y||^2 / 2) / ||y||,

so a returned distance is certified to lie in [dist - gap, dist]. The solver, per block of classes:

1. screening (float32): candidates = the most similar classes, a few hundred pairwise Frank-Wolfe steps,
   then candidates re-chosen by the approximate residual (support first, then the most violated); skipped
   for K <= ``_SOLVE_ALL`` (32) classes all candidates of each other: step 2 starts from the most similar;
2. exact solve (float64) on the candidates: pairwise Frank-Wolfe from the warm start, then Wolfe's
   nearest-point active-set method (Wolfe 1976), whose affine sub-problems are solved by Cholesky;
3. certificate against *all* K - 1 other classes (exact in float64: one float32 product, then float64 scores
   for the classes that can attain the minimum, ``_scores``); classes whose gap exceeds ``tol`` get their
   most violated classes added to the candidates (column generation) and go back to step 2.

GNC2 alone (``min_one_vs_rest_distance``) screens every class with rigorous bounds (bfloat16 or float32
K-wide products, their rounding bounded), tightens the bounds of the classes near the minimum by float32
column generation, and solves exactly, by branch and bound, only the classes that can still attain it.
For K <= ``_SOLVE_ALL`` classes (all candidates of each other) it solves every class instead: there the
screening costs more than it saves (GNC2 in 2.7-7.6x less time at K = 10-32, d = 16-512, one thread of an
AVX512 CPU); from about 64 classes at d >= K the screening's warm start and branch and bound win
(results/benchmarks/gnc2_small_k.md).

Everything is batched tensors on the device of W. W is never copied to float64 as a whole (``_UnitRows``):
it is kept as given (float64, or float32 as under float32 accumulation), with its float64 row norms and
one float32 copy of the unit rows for screening; float64 unit rows are formed per block of classes, and
the certificate's scores against all K classes in chunks of ``_CHUNK_ENTRIES`` entries. Memory beyond W:
``4 K d`` bytes (the float32 unit rows), plus per block about ``block * candidates * d * 12`` bytes and
``block * K * 16``; blocks are sized to stay near 256 MB.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry._rounding import _screen_dtype
from kdcollapse.geometry._screening import _screen_all, _tighten
from kdcollapse.geometry._solver import _CANDIDATES, _SOLVE_ALL, NearestPoints, _block, _solve_classes
from kdcollapse.geometry._solver import _certify  # noqa: F401 - the certificate of a solution, read by its tests
from kdcollapse.geometry._unit_rows import _UnitRows, unit_rows

__all__ = ["MinimumDistance", "NearestPoints", "min_one_vs_rest_distance", "nearest_points", "one_vs_one_distance",
           "one_vs_rest_distances", "optimal_features", "unit_rows"]


def nearest_points(
    W: Tensor,
    *,
    tol: float = 1e-10,
    candidates: int = _CANDIDATES,
    block_size: int | None = None,
    progress: bool = False,
    classes: Tensor | None = None,
) -> NearestPoints:
    """Solve the K one-vs-rest QPs of eq. 3 (GNC paper) exactly; see the module docstring.

    Rows of ``W`` (K, d) are normalised first (the paper's classifiers live on the sphere). With
    ``classes`` (indices) only those QPs are solved; the other entries of the result are nan.
    """
    rows = _UnitRows(W)
    K, d = rows.shape
    if tol <= 0:
        raise KdcollapseError(f"tol must be positive, got {tol}")
    if candidates < 1:
        raise KdcollapseError(f"candidates must be at least 1, got {candidates}")
    todo = torch.arange(K, device=rows.device) if classes is None else torch.as_tensor(classes, device=rows.device)
    solved = _solve_classes(rows, todo, tol=tol, candidates=candidates, block_size=block_size, progress=progress)
    distances = torch.full((K,), math.nan, dtype=torch.float64, device=rows.device)
    gaps = distances.clone()
    offsets = torch.full((K, d), math.nan, dtype=torch.float64, device=rows.device)
    distances[todo], gaps[todo], offsets[todo] = solved
    return NearestPoints(distances, gaps, offsets)


def one_vs_rest_distances(
    W: Tensor,
    *,
    return_certificate: bool = False,
    tol: float = 1e-10,
    candidates: int = _CANDIDATES,
    block_size: int | None = None,
    progress: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """Exact dist(w_k, conv{w_j : j != k}) for every class k (GNC paper Def. 2.1, eq. 3).

    Args:
        W: (K, d) classifier, one class vector per row, any float dtype and device. Rows are
            normalised to unit length first (the paper's weights live on the sphere).
        return_certificate: also return the duality gaps.
        tol: target certified accuracy (absolute, in distance units).
        candidates: classes per QP before column generation adds more.
        block_size: classes solved together (default: sized for ~256 MB of work arrays).
        progress: show a tqdm bar over blocks.

    Returns:
        (K,) float64 distances -- the distance, not its square -- on the device of W; with
        ``return_certificate`` also (K,) gaps: each true distance lies in [distance - gap, distance].
        ``rho_one_vs_rest(W)`` of the paper (GNC2) is ``distances.min()``.

    Example:
        >>> import math, torch
        >>> angles = 2 * math.pi * torch.arange(6) / 6
        >>> W = torch.stack([angles.cos(), angles.sin()], 1)
        >>> one_vs_rest_distances(W)  # 1 - cos(2 pi / 6) for each class
        tensor([0.5000, 0.5000, 0.5000, 0.5000, 0.5000, 0.5000], dtype=torch.float64)
    """
    sol = nearest_points(W, tol=tol, candidates=candidates, block_size=block_size, progress=progress)
    return (sol.distances, sol.gaps) if return_certificate else sol.distances


def optimal_features(W: Tensor, *, tol: float = 1e-10) -> Tensor:
    """Optimal features of the HardMax problem for a fixed classifier (GNC Lemma C.4, eq. C.19 / 9).

    h_k = (w_k - P(w_k)) / ||w_k - P(w_k)||, P the projection onto conv{w_j : j != k}; it attains
    min_{||h||=1} max_{k' != k} <w_k' - w_k, h> = -dist(w_k, conv{w_j : j != k}). Returns (K, d) float64.
    For a softmax code these are the collapsed class features of Theorem 3.5 (non-rattler classes).
    """
    sol = nearest_points(W, tol=tol)
    return torch.nn.functional.normalize(-sol.offsets, dim=1)


class MinimumDistance(NamedTuple):
    """GNC2 = min_k dist(w_k, conv{w_j : j != k}) by screening, and how much exact solving it took."""

    value: Tensor  # 0-d float64: the minimum, certified to ``tol`` like ``nearest_points``
    gap: Tensor  # 0-d: its certificate, the largest gap of the solved classes (minimum in [value - gap, value])
    upper: Tensor  # (K,) screened upper bounds: u_k >= ||y_k|| for a feasible point y_k of each QP
    lower: Tensor  # (K,) screened lower bounds l_k <= dist_k (certificates against all K - 1 classes)
    solved: Tensor  # indices of the classes solved exactly, in the order solved (branch and bound)


def min_one_vs_rest_distance(W: Tensor, *, tol: float = 1e-10, candidates: int = _CANDIDATES,
                             screen_candidates: int = _CANDIDATES, block_size: int | None = None,
                             screen_dtype: torch.dtype | None = None) -> MinimumDistance:
    """GNC2 (the paper's rho_one-vs-rest) exactly, solving only the QPs that can attain the minimum.

    Screening (float32 Frank-Wolfe on the ``screen_candidates`` classes most similar to each class, as the first
    stage of :func:`nearest_points`) gives every class k a feasible point, hence an upper bound u_k >= dist_k,
    and its certificate against all K - 1 classes a lower bound l_k <= dist_k (see :func:`_screen_bounds`).
    A class with l_k > min_j u_j + tol cannot attain the minimum. The others, if more than one block of the
    exact solver, get tighter bounds from two rounds of float32 column generation (:func:`_tighten`); those
    still not excluded go to the exact solver by branch and bound: smallest upper bound first, and a class is
    skipped once its lower bound exceeds the best exact distance found. The result is the exact minimum with
    the exact solver's certificate, at the cost of one screening pass (two K x K products by blocks, O(K^2 d),
    and the candidate Grams, O(K m^2 d)) instead of K exact QPs.

    ``screen_dtype`` is the precision of the screening's two K x K products (choosing candidates, scoring the
    certificate): ``torch.bfloat16`` where bfloat16 products are native and accumulate in float32 (see
    :func:`_screen_dtype`, the default's rule; asking for it elsewhere is an error), else ``torch.float32``.
    Neither changes the answer: every bound subtracts its product's proven rounding error, and the classes a
    bfloat16 certificate does not exclude are certified again at float32's error from the float32 scores of
    the few classes their bfloat16 scores cannot exclude (:func:`_window_minimum`).
    """
    rows = _UnitRows(W)
    K, d = rows.shape
    if screen_candidates < 1:
        raise KdcollapseError(f"screen_candidates must be at least 1, got {screen_candidates}")
    if tol <= 0:
        raise KdcollapseError(f"tol must be positive, got {tol}")
    if candidates < 1:
        raise KdcollapseError(f"candidates must be at least 1, got {candidates}")
    native = _screen_dtype(rows.device)
    dtype = native if screen_dtype is None else screen_dtype
    if dtype not in (torch.float32, torch.bfloat16):
        raise KdcollapseError(f"screen_dtype must be torch.float32 or torch.bfloat16, got {dtype}")
    if dtype != native and dtype == torch.bfloat16:
        raise KdcollapseError(f"screen_dtype=torch.bfloat16 needs native bfloat16 products summed in float32, which "
                              f"{rows.device.type} does not have here (the rounding bound would not hold); use "
                              "torch.float32 or leave screen_dtype unset")
    low = rows.W32 if dtype == torch.float32 else rows.W32.to(dtype)
    if K <= _SOLVE_ALL and K - 1 <= min(candidates, screen_candidates):  # few classes: solve all, no screening
        every = torch.arange(K, device=rows.device)
        exact = _solve_classes(rows, every, tol=tol, candidates=candidates, block_size=block_size, low=low)
        return MinimumDistance(exact.distances.min(), exact.gaps.max(), exact.distances,
                               exact.distances - exact.gaps, every)
    m = min(screen_candidates, K - 1)
    upper, lower, kept = _screen_all(rows, m, low, tol)
    block = block_size or _block(K, d, min(candidates, K - 1))
    if int((lower <= upper.min() + tol).sum()) > block:  # more than one exact block can attain the minimum
        _tighten(rows, upper, lower, kept, m, tol, low)
    return _branch_and_bound(rows, upper, lower, tol=tol, candidates=candidates, block_size=block_size, low=low)


def _branch_and_bound(rows: _UnitRows, upper: Tensor, lower: Tensor, *, tol: float, candidates: int,
                      block_size: int | None, low: Tensor) -> MinimumDistance:
    """The exact minimum from screened bounds: the classes whose lower bound is within ``tol`` of the smallest
    upper bound, solved exactly a block at a time in order of their upper bounds, each block without the
    classes whose lower bound exceeds the best exact distance so far by ``tol`` (they cannot attain it)."""
    K, d = rows.shape
    todo = (lower <= upper.min() + tol).nonzero().flatten()
    todo = todo[upper[todo].argsort(stable=True)]
    block = block_size or _block(K, d, min(candidates, K - 1))
    first = max(1, block // 4)  # a small first block: the best distance early, to skip more classes after it
    best, gap, solved = None, None, []
    for chunk in (todo[:first], *todo[first:].split(block)):
        if best is not None:
            chunk = chunk[lower[chunk] <= best + tol]
        if not len(chunk):
            continue
        exact = _solve_classes(rows, chunk, tol=tol, candidates=candidates, block_size=block_size, low=low)
        value = exact.distances.min()
        best = value if best is None else torch.minimum(best, value)
        gap = exact.gaps.max() if gap is None else torch.maximum(gap, exact.gaps.max())
        solved.append(chunk)
    return MinimumDistance(best, gap, upper, lower, torch.cat(solved))


def one_vs_one_distance(W: Tensor) -> float:
    """min_{k != k'} ||w_k - w_k'|| over normalised rows (GNC eq. 11, the Tammes objective)."""
    W = unit_rows(W)
    K = W.shape[0]
    best = math.inf
    block = max(1, 2**25 // K)
    for start in range(0, K, block):
        k = torch.arange(start, min(start + block, K), device=W.device)
        cos = W[k] @ W.T
        cos[torch.arange(len(k)), k] = -math.inf
        nearest = cos.argmax(1)  # recompute the distance directly: 2 - 2cos loses half the digits
        best = min(best, (W[k] - W[nearest]).norm(dim=1).min().item())
    return best
