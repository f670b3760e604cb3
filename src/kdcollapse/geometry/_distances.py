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
import warnings
from typing import NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from kdcollapse.errors import KdcollapseError

_CANDIDATES = 128  # classes per QP before column generation (supports are ~70 for K=1e4, d=512)
_SCREEN_STEPS = 150  # float32 pairwise Frank-Wolfe steps used to pick candidates
_SOLVE_STEPS = 30  # float64 pairwise Frank-Wolfe steps before the active-set polish
_WOLFE_ITERATIONS = 300
_MAX_ROUNDS = 10  # column-generation rounds
_REFINE_ROUNDS = 2  # float32 column-generation rounds for the classes the screening leaves near the minimum
_PRICE_EXTRA = 64  # classes beyond the support each round prices in (supports reach ~230 at d = 4096, K = 32,000)
_BLOCK_BYTES = 256 * 2**20
_PROXIMAL_DELTA = 1e-10  # relative ridge of the affine sub-problems (handles dependent supports)
_PROXIMAL_STEPS = 3
_CHUNK_ENTRIES = 2**24  # rows of W widened to float64 at a time: 128 MiB whatever d
_WINDOW = 4096  # most classes per row whose bfloat16 scores a certificate recomputes in float32 ...
_WINDOW_SHARE = 64  # ... and at most K / _WINDOW_SHARE: a larger window's gather costs more than a K-wide product
_SOLVE_ALL = 32  # up to this many classes (all candidates of each other) no screening: every QP solved from a vertex


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


class NearestPoints(NamedTuple):
    """Solution of the K one-vs-rest QPs (all float64, on the device of W)."""

    distances: Tensor  # (K,) ||w_k - P(w_k)||
    gaps: Tensor  # (K,) certified: true distance in [distance - gap, distance]
    offsets: Tensor  # (K, d) y_k = P(w_k) - w_k, P the projection onto conv{w_j : j != k}


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


def _solve_classes(rows: _UnitRows, todo: Tensor, *, tol: float, candidates: int, block_size: int | None,
                   progress: bool = False, low: Tensor | None = None) -> NearestPoints:
    """The QPs of the classes ``todo`` only: (len(todo),) distances and gaps, (len(todo), d) offsets.
    ``low``: the unit rows whose products choose the first candidates (default ``rows.W32``)."""
    K, d = rows.shape
    m = min(candidates, K - 1)
    block = block_size or _block(K, d, m)
    distances = torch.full((len(todo),), math.nan, dtype=torch.float64, device=rows.device)
    gaps = distances.clone()
    offsets = torch.full((len(todo), d), math.nan, dtype=torch.float64, device=rows.device)
    positions = torch.arange(len(todo), device=rows.device)
    for where in tqdm(positions.split(block), desc="one-vs-rest distances", unit="block", disable=not progress):
        k = todo[where]
        if m == K - 1 and K <= _SOLVE_ALL:  # few classes, all candidates: start from the most similar one
            cand = _candidates(rows.W32 if low is None else low, k, m)
            lam = torch.zeros(cand.shape, dtype=torch.float64, device=rows.device)
            lam[:, 0] = 1
        else:
            cand, lam = _screen(rows.W32 if low is None else low, rows.W32, k, m)
        for _ in range(_MAX_ROUNDS):
            lam, P = _solve(rows, k, cand, lam, tol)
            y, gap, scores = _certify(rows, k, lam, P)
            distances[where], gaps[where], offsets[where] = y.norm(dim=1), gap, y
            bad = gap > tol
            if not bad.any():
                break
            k, where, (cand, lam) = k[bad], where[bad], _price(scores[bad], cand[bad], lam[bad], m)
    worst = gaps.nan_to_num(0.0).max().item() if len(todo) else 0.0
    if worst > tol:
        warnings.warn(f"one-vs-rest distances certified only to {worst:.3g} (> tol={tol:g})", stacklevel=4)
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


def _screen_dtype(device: torch.device) -> torch.dtype:
    """bfloat16 for the screening's K x K products where they are native and accumulate in float32: on CPU
    where oneDNN has bfloat16 kernels (AVX-512 or AMX; an AVX2-only CPU emulates them far slower than float32),
    on CUDA where bfloat16 is supported and reduced-precision reductions are off
    (``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction``, on by default, lets cuBLAS sum in
    bfloat16, which the rounding bound of :func:`_product_error` does not cover); float32 otherwise."""
    if device.type == "cpu":
        native = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    elif device.type == "cuda":
        native = (torch.cuda.is_bf16_supported()
                  and not torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction)
    else:
        native = False
    return torch.bfloat16 if native else torch.float32


class _Screened(NamedTuple):
    """The screening's state of the classes it keeps (near the minimum): their float32 Frank-Wolfe weights on
    their candidates and the float32 y, from which :func:`_tighten` goes on."""

    classes: Tensor  # (n,) class indices
    candidates: Tensor  # (n, m)
    weights: Tensor  # (n, m) float32
    directions: Tensor  # (n, d) float32 y


def _screen_all(rows: _UnitRows, m: int, low: Tensor, tol: float) -> tuple[Tensor, Tensor, _Screened]:
    """Screened bounds (upper, lower) of every class, a wide block of classes at a time (:func:`_screen_bounds`),
    and the state of the classes whose lower bound is not above the smallest upper bound so far (only they
    can attain the minimum; the set is pruned as that bound falls)."""
    K, d = rows.shape
    upper = torch.empty(K, dtype=torch.float64, device=rows.device)
    lower = torch.empty_like(upper)
    kept = _Screened(torch.empty(0, dtype=torch.long, device=rows.device),
                     torch.empty(0, m, dtype=torch.long, device=rows.device), rows.W32.new_empty(0, m),
                     rows.W32.new_empty(0, d))
    for k in torch.arange(K, device=rows.device).split(_wide_block(K)):
        smallest = float(upper[: int(k[0])].min()) if int(k[0]) else math.inf
        upper[k], lower[k], cand, lam, Y = _screen_bounds(rows, k, m, low, smallest, tol)
        threshold = upper[: int(k[-1]) + 1].min() + tol
        near = lower[k] <= threshold
        kept = _Screened(*(torch.cat([old, new[near]]) for old, new in zip(kept, (k, cand, lam, Y))))
        kept = _Screened(*(field[lower[kept.classes] <= threshold] for field in kept))
    return upper, lower, kept


def _wide_block(K: int) -> int:
    """Classes per K-wide product (its (b, K) result at most ``_BLOCK_BYTES`` in float32; at most 1024)."""
    return max(1, min(1024, _BLOCK_BYTES // (4 * K)))


def _screen_bounds(rows: _UnitRows, k: Tensor, m: int, low: Tensor, smallest: float = math.inf,
                   tol: float = 0.0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """Screened bounds u_k >= dist_k >= l_k of the classes ``k`` (float64), their candidates, float32
    Frank-Wolfe weights and float32 directions y_k.

    ``low`` is W's unit rows in the products' precision (``rows.W32`` or a bfloat16 copy of it). The m
    candidates of each class are its most similar classes by one product with ``low``; float32 Frank-Wolfe on
    them gives weights lambda and y = sum_j lambda_j (w_j - w_k) in float32, and u_k = :func:`_feasible_norm`
    (a rigorous bound on the norm of the feasible point the weights define); l_k = :func:`_lower_bounds` of
    the direction -y, one more product with ``low``, its rounding error subtracted; with bfloat16 products,
    at float32's error for the classes whose bound is not above ``smallest`` (the smallest upper bound so far)
    or these classes' smallest upper bound, plus ``tol`` (the others cannot attain the minimum).
    """
    cand = _candidates(low, k, m)
    lam, Y = _weights_in_parts(rows.W32, k, cand)
    upper = _feasible_norm(lam, Y)
    bound = _lower_bounds(rows, k, Y, low, refine_below=min(smallest, float(upper.min())) + tol)
    return upper, torch.minimum(bound, upper), cand, lam, Y


def _weights_in_parts(W32: Tensor, k: Tensor, cand: Tensor, lam: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """:func:`_screen_weights` of the classes ``k`` in batches of :func:`_fw_block` classes (their candidate rows
    near ``_BLOCK_BYTES``), through one reused buffer (fresh pages cost more than the gather)."""
    b, m = cand.shape
    parts = torch.arange(b, device=k.device).split(_fw_block(W32.shape[1], m))
    buffer = W32.new_empty(len(parts[0]) * m, W32.shape[1])
    weights, Y = W32.new_empty(b, m), W32.new_empty(b, W32.shape[1])
    for part in parts:
        weights[part], Y[part] = _screen_weights(W32, k[part], cand[part], buffer, None if lam is None else lam[part])
    return weights, Y


def _fw_block(d: int, m: int) -> int:
    """Classes per screening Frank-Wolfe batch: its float32 candidate rows and Grams near ``_BLOCK_BYTES``."""
    return max(1, min(1024, _BLOCK_BYTES // (m * d * 8 + m * m * 12)))


def _feasible_norm(lam: Tensor, y: Tensor) -> Tensor:
    """A rigorous upper bound on ||y*||, y* = sum_j (lambda_j / s) (w_j - w_k) with s = sum lambda (a feasible
    point of the QP), from the float32 weights ``lam`` (b, m) >= 0 and ``y`` (b, d) = fl32(sum_j lambda_j P_j),
    P_j = fl32(W32_j - W32_k), W32 the float32 unit rows.

    With u = 2^-24: ||W32_j - w_j|| <= u, so ||P_j - (w_j - w_k)|| <= 2u + u ||W32_j - W32_k|| <= 4u + 2u^2; the
    float32 inner products over the m weights err by at most gamma_m sum_j lambda_j ||P_j|| <= gamma_m s (2 + 4u
    + 2u^2) in norm (Higham eq. 3.5, any order of summation). So ||s y* - y|| <= s e and ||y*|| <= ||y|| / s + e;
    the float64 arithmetic of the bound itself is covered by a relative 2^-40.
    """
    u, m = 2.0**-24, lam.shape[1]
    e = 4 * u + 2 * u * u + _gamma(m, u) * (2 + 4 * u + 2 * u * u)
    s = lam.double().sum(1)
    return (y.double().norm(dim=1) / s + e) * (1 + 2.0**-40)


def _gamma(n: int, u: float) -> float:
    """gamma_n = n u / (1 - n u), the relative error bound of an n-term inner product with unit roundoff u."""
    return n * u / (1 - n * u)


def _product_error(dtype: torch.dtype, d: int) -> float:
    """c such that |computed <w_j, h> - <w_j, h>| <= c ||h|| + d 2^-120 for the product of a direction h,
    exactly representable in ``dtype``, with the unit rows in ``dtype`` (from the float32 unit rows W32),
    float32 accumulation.

    float32 (u = 2^-24): ||W32_j - w_j|| <= u plus the d-term inner product's gamma_d; gamma_{d+4} covers both
    (as before: Higham, Accuracy and Stability, eq. 3.5). bfloat16 (v = 2^-8): the rows' second rounding adds
    v (1 + u), the float32 accumulation gamma_{d+4} (1 + v)(1 + u), and the result's rounding to bfloat16 at
    most 2 v of its size (taken twice a round-to-nearest's half unit, for any rounding mode). The absolute
    term covers subnormals flushed to zero.
    """
    u = 2.0**-24
    if dtype == torch.float32:
        return _gamma(d + 4, u)
    v = 2.0**-8
    accumulated = (1 + v) * (1 + u) * (1 + _gamma(d + 4, u))
    return v * (1 + u) + u + (1 + v) * (1 + u) * _gamma(d + 4, u) + 2 * v * accumulated


def _lower_bounds(rows: _UnitRows, k: Tensor, Y: Tensor, low: Tensor, return_scores: bool = False,
                  refine_below: float = math.inf) -> Tensor | tuple[Tensor, Tensor]:
    """Certified lower bounds min_j <w_k - w_j, h> (Lemma C.6's dual) of the classes ``k``, h = -y/||y||
    for a direction y near the float32 rows of ``Y`` (any unit h gives a lower bound).

    The smallest score min_{j != k} <w_j, y> comes from one product with ``low``. In float32 (``rows.W32``),
    y = Y and the product's rounding error is subtracted (:func:`_float32_minimum`). In bfloat16, y = Y rounded
    to bfloat16 and the bfloat16 product's error (:func:`_product_error`, ~0.012 ||y||) is subtracted; the
    bounds not above ``refine_below`` (the classes that may still attain the minimum) are raised to the bound
    of y = Y at float32's error, from the float32 scores of the few classes the bfloat16 ones cannot exclude
    (:func:`_window_minimum`). With ``return_scores`` also the product (b, K), +inf at j = k (for pricing).
    """
    if low.dtype == torch.float32:
        scores, lowest = _float32_minimum(rows, k, Y)
        bound = _certified(rows, k, Y.double(), lowest)
    else:
        scores, d = _products(Y, k, low), rows.shape[1]
        direction = Y.to(low.dtype).double()
        error = _product_error(low.dtype, d) * direction.norm(dim=1) + d * 2.0**-120
        bound = _certified(rows, k, direction, scores.min(1).values.double() - error)
        refine = (bound <= refine_below).nonzero().flatten()
        if len(refine):
            lowest = _window_minimum(rows, k[refine], Y[refine], scores[refine])
            bound[refine] = torch.maximum(bound[refine], _certified(rows, k[refine], Y[refine].double(), lowest))
    return (bound, scores) if return_scores else bound


def _certified(rows: _UnitRows, k: Tensor, direction: Tensor, lowest: Tensor) -> Tensor:
    """The lower bound min_j <w_j - w_k, y> / ||y|| (0 for y = 0 or below 0) from ``lowest``, a certified lower
    bound of min_{j != k} <w_j, y>, for the float64 rows y of ``direction``; <w_k, y> in float64."""
    norm = direction.norm(dim=1)
    certified = (lowest - (direction * rows.gather(k)).sum(1)) / norm
    return torch.where(norm > 0, certified.clamp_min(0), 0.0)


def _products(Y: Tensor, k: Tensor, low: Tensor) -> Tensor:
    """``Y`` rounded to ``low``'s dtype times ``low.T`` (b, K), +inf at j = k."""
    scores = Y.to(low.dtype) @ low.T
    scores[torch.arange(len(k), device=k.device), k] = math.inf
    return scores


def _float32_minimum(rows: _UnitRows, k: Tensor, Y: Tensor) -> tuple[Tensor, Tensor]:
    """The scores <w_j, y> (b, K) of the float32 rows ``y`` of ``Y`` from one float32 product, +inf at j = k,
    and a certified lower bound of min_{j != k} <w_j, y>: the product's minimum less :func:`_product_error`;
    float64 scores (``rows.scores``) where float32 products may use TF32 or bfloat16 inner products
    (``_ieee_float32_matmul``)."""
    if not _ieee_float32_matmul(rows.device):
        scores = _float64_scores(rows, k, Y.double())
        return scores, scores.min(1).values
    scores = _products(Y, k, rows.W32)
    error = _product_error(torch.float32, rows.shape[1]) * Y.double().norm(dim=1) + rows.shape[1] * 2.0**-120
    return scores, scores.min(1).values.double() - error


def _window_minimum(rows: _UnitRows, k: Tensor, Y: Tensor, coarse: Tensor) -> Tensor:
    """A certified lower bound of min_{j != k} <w_j, y> for the float32 rows y of ``Y``, from ``coarse``, the
    bfloat16 scores of y rounded to bfloat16 (:func:`_products`), at float32's error.

    Before its rounding to bfloat16, a coarse score is within A = ||y - y_bf16|| + (v (1 + u) + u + (1 + v)(1 + u)
    gamma_{d+4}) ||y_bf16|| + d 2^-120 of <w_j, y> (unit w_j; the terms of :func:`_product_error`), and that
    rounding moves it by at most 2v of its size, so c_j = coarse_j is within E_j = A + r |c_j|, r = 2v / (1 - 2v),
    of <w_j, y>. The class attaining the minimum has c_j - E_j <= min_i (c_i + E_i) = c_min + E_min (both sides
    increase with c_j), i.e. c_j is at most a threshold: a few hundred classes per row where the smallest
    scores are small, as near a QP's optimum. Only their scores are computed again in float32
    (:func:`_gathered_minimum`), rows with similar counts together; rows with more than ``_WINDOW`` or
    K / ``_WINDOW_SHARE`` such classes (y near zero, ties, large smallest scores) take the full float32
    product, which costs less than gathering that many rows (on the CPU of the benchmarks)."""
    d = rows.shape[1]
    u, v = 2.0**-24, 2.0**-8
    rounded = Y.to(coarse.dtype).double()
    absolute = ((v * (1 + u) + u + (1 + v) * (1 + u) * _gamma(d + 4, u)) * rounded.norm(dim=1) + d * 2.0**-120
                + (Y.double() - rounded).norm(dim=1)) * (1 + 2.0**-40)
    r = 2 * v / (1 - 2 * v) * (1 + 2.0**-40)
    first = coarse.min(1).values.double()
    edge = first + r * first.abs() + 2 * absolute
    edge = edge + 2.0**-40 * (1 + edge.abs())  # covers the float64 arithmetic
    threshold = torch.where(edge >= 0, edge / (1 - r), edge / (1 + r))  # c - A - r |c| > c_min + E_min above it
    threshold = (threshold + 2.0**-7 * threshold.abs() + 2.0**-120).to(coarse.dtype)  # not below it once rounded
    count = (coarse <= threshold[:, None]).sum(1)
    lowest = torch.empty(len(k), dtype=torch.float64, device=k.device)
    wide = count > min(_WINDOW, max(1, coarse.shape[1] // _WINDOW_SHARE))
    rest = wide.nonzero().flatten()
    if len(rest):
        lowest[rest] = _float32_minimum(rows, k[rest], Y[rest])[1]
    order = (~wide).nonzero().flatten()
    if not len(order):
        return lowest
    order = order[count[order].argsort(stable=True)]
    most = int(count[order[-1]])
    buffer = rows.W32.new_empty(max(1, min(len(order), _BLOCK_BYTES // (2 * most * d * 4))) * most, d)
    for part in order.split(len(buffer) // most):
        near = coarse[part].topk(int(count[part].max()), dim=1, largest=False).indices
        lowest[part] = _gathered_minimum(rows, Y[part], near, buffer)
    return lowest


def _gathered_minimum(rows: _UnitRows, Y: Tensor, near: Tensor, buffer: Tensor) -> Tensor:
    """A certified lower bound of min_t <w_{near_t}, y> per float32 row y of ``Y``: float32 inner products
    with the float32 unit rows ``near`` (gathered into ``buffer``) less :func:`_product_error`, or float64 ones
    where float32 products are not IEEE (``_ieee_float32_matmul``)."""
    if not _ieee_float32_matmul(rows.device):
        return torch.einsum("bd,btd->bt", Y.double(), rows.gather(near)).min(1).values
    gathered = torch.index_select(rows.W32, 0, near.flatten(), out=buffer[: near.numel()]).view(*near.shape, -1)
    scores = torch.einsum("bd,btd->bt", Y, gathered).min(1).values.double()
    error = _product_error(torch.float32, rows.shape[1]) * Y.double().norm(dim=1) + rows.shape[1] * 2.0**-120
    return scores - error


def _tighten(rows: _UnitRows, upper: Tensor, lower: Tensor, kept: _Screened, m: int, tol: float,
             low: Tensor) -> None:
    """Tighten, in place, the bounds of the classes the screening leaves near the minimum (l_k <= min u + tol),
    from the screening's state, a wide block of classes at a time in order of u_k: per round, the scores of y
    (one product with ``low``) price in the most violated classes (:func:`_price`), float32 Frank-Wolfe runs
    again from the current weights (a new y and upper bound, :func:`_feasible_norm`), and the new y's
    certificate (:func:`_lower_bounds`, whose product gives the next round's scores) a new lower bound, up to
    ``_REFINE_ROUNDS`` rounds while the class can still attain the minimum. Both bounds stay rigorous (the
    smaller upper, the larger lower bound). On Gaussian classifiers one round takes the lower bound's gap from
    ~2e-3 to about the float32 certificate's floor (~1e-4 at d = 2,048)."""
    near = lower[kept.classes] <= upper.min() + tol
    kept = _Screened(*(field[near] for field in kept))
    order = upper[kept.classes].argsort(stable=True)
    for part in order.split(_wide_block(rows.shape[0])):
        k, cand, lam, y = (field[part] for field in kept)
        scores = None
        for _ in range(_REFINE_ROUNDS):
            going = lower[k] <= upper.min() + tol
            if not going.any():
                break
            k, cand, lam, y = k[going], cand[going], lam[going], y[going]
            scores = _products(y, k, low) if scores is None else scores[going]
            cand, lam = _price(scores, cand, lam.double(), m)
            del scores
            lam, y = _weights_in_parts(rows.W32, k, cand, lam)
            upper[k] = torch.minimum(upper[k], _feasible_norm(lam, y))
            bound, scores = _lower_bounds(rows, k, y, low, return_scores=True)
            lower[k] = torch.maximum(lower[k], torch.minimum(bound, upper[k]))


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


def _ieee_float32_matmul(device: torch.device) -> bool:
    """Whether float32 matrix products on ``device`` are computed in float32 arithmetic: not with TF32 or
    bfloat16 inner products (``torch.set_float32_matmul_precision`` "high"/"medium", the backends'
    ``fp32_precision``, cuBLAS's ``allow_tf32``), which the float32 screening bound of ``_screen_bounds``
    assumes. Devices other than CPU and CUDA answer False (the float64 scores are used there)."""
    if device.type not in ("cpu", "cuda"):
        return False
    backend = torch.backends.mkldnn if device.type == "cpu" else torch.backends.cuda
    matmul = getattr(backend, "matmul", None)
    if hasattr(matmul, "fp32_precision"):  # torch >= 2.9: per-backend settings ("none" inherits the parent's)
        settings = (torch.backends.fp32_precision, getattr(backend, "fp32_precision", "none"), matmul.fp32_precision)
        return all(setting in ("none", "ieee") for setting in settings)
    if torch.get_float32_matmul_precision() != "highest":
        return False
    return device.type == "cpu" or not torch.backends.cuda.matmul.allow_tf32


def _block(K: int, d: int, m: int) -> int:
    """Classes per block so that the work arrays stay near ``_BLOCK_BYTES``."""
    return max(1, min(1024, _BLOCK_BYTES // (m * d * 12 + K * 16 + m * m * 8)))


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


# --- the solver ---------------------------------------------------------------------------------


def _screen(low: Tensor, W32: Tensor, k: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """Guess of each QP's support: float32 Frank-Wolfe on the m most similar classes (by products with ``low``,
    W's unit rows in float32 or bfloat16), then repricing by one more product with ``low``."""
    cand = _candidates(low, k, m)
    lam, y = _screen_weights(W32, k, cand)
    scores = y.to(low.dtype) @ low.T
    scores[torch.arange(len(k), device=k.device), k] = math.inf
    return _price(scores, cand, lam.double(), m)


def _candidates(low: Tensor, k: Tensor, m: int) -> Tensor:
    """The m classes most similar to each of ``k`` (most similar first), by one product with ``low``."""
    sims = low[k] @ low.T
    sims[torch.arange(len(k), device=k.device), k] = -math.inf
    return sims.topk(m, dim=1).indices


def _screen_weights(W32: Tensor, k: Tensor, cand: Tensor, buffer: Tensor | None = None,
                    lam: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """Float32 Frank-Wolfe weights on the candidates ``cand`` of each of ``k`` (150 pairwise steps from ``lam``,
    by default the first, most similar, candidate) and the float32 y = sum_j lambda_j (W32_j - W32_k).
    ``buffer``: at least ``cand.numel()`` rows of d float32 to hold the candidates' differences (else they
    are allocated)."""
    b, m = cand.shape
    out = None if buffer is None else buffer[: b * m]
    P = torch.index_select(W32, 0, cand.flatten(), out=out).view(b, m, -1).sub_(W32[k][:, None, :])
    if lam is None:
        lam = torch.zeros(cand.shape, dtype=W32.dtype, device=k.device)
        lam[:, 0] = 1
    lam = _pairwise_frank_wolfe(P @ P.mT, lam.to(W32.dtype), _SCREEN_STEPS)
    return lam, torch.einsum("bm,bmd->bd", lam, P)


def _price(scores: Tensor, cand: Tensor, lam: Tensor, m: int) -> tuple[Tensor, Tensor]:
    """Column generation: keep the support, fill up with the classes j of smallest <w_j, y> (at least
    ``_PRICE_EXTRA`` of them beyond the support).

    ``scores`` (b, K) holds <w_j, y> with +inf at j = k; <w_j - w_k, y> < ||y||^2 marks a violated
    optimality condition, and the smallest scores are the most violated. Returns new candidates and
    the current weights moved onto them.
    """
    support = lam > 0
    m = min(scores.shape[1] - 1, max(m, int(support.sum(1).max()) + _PRICE_EXTRA))
    key = scores.scatter(1, cand, torch.where(support, -math.inf, scores.gather(1, cand)))
    new = key.topk(m, dim=1, largest=False).indices
    dense = torch.zeros(scores.shape, dtype=lam.dtype, device=lam.device).scatter_(1, cand, lam)
    return new, dense.gather(1, new)


def _solve(rows: _UnitRows, k: Tensor, cand: Tensor, lam: Tensor, tol: float) -> tuple[Tensor, Tensor]:
    """Float64 solve of the QPs restricted to the candidates; returns weights and P = w_cand - w_k."""
    P = rows.gather(cand).sub_(rows.gather(k)[:, None, :])
    M = P @ P.mT
    lam = _pairwise_frank_wolfe(M, lam, _SOLVE_STEPS)
    return _wolfe_active_set(M, lam, tol / 10), P


def _certify(rows: _UnitRows, k: Tensor, lam: Tensor, P: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """y = sum lambda_j p_j, its certified gap against all classes, and the scores <w_j, y>."""
    y = torch.einsum("bm,bmd->bd", lam, P)
    norm = y.norm(dim=1)
    scores = _scores(rows, k, y)
    lower = (scores.min(1).values - (y * rows.gather(k)).sum(1)) / norm  # min_j <w_j - w_k, y> / ||y||
    gap = torch.where(norm > 0, torch.minimum((norm - lower).clamp_min(0), norm), 0.0)
    return y, gap, scores


def _scores(rows: _UnitRows, k: Tensor, y: Tensor) -> Tensor:
    """<w_j, y> for every class j (b, K) float64, +inf at j = k, exact (float64) wherever it can be a row's
    minimum: under IEEE float32 products (``_ieee_float32_matmul``) one float32 product, each score within
    E = gamma_{d+4} ||y|| + d 2^-125 of the exact one (see :func:`_screen_bounds`), and float64 products for
    the classes within 2E of the float32 minimum, the only ones that can attain the exact minimum (a class
    above it by more than 2E is above the true minimum); otherwise, or when more than a chunk's worth of
    classes is that close (y near zero, as for a class with a duplicate row), float64 throughout
    (``rows.scores``, a chunk of W's rows at a time)."""
    K, d = rows.shape
    if not _ieee_float32_matmul(rows.device):
        return _float64_scores(rows, k, y)
    scores = (y.float() @ rows.W32.T).double()
    scores[torch.arange(len(k), device=k.device), k] = math.inf
    margin = 2 * (_gamma(d + 4, 2.0**-24) * y.norm(dim=1) + d * 2.0**-125)
    t, most = min(32, K - 1), max(32, _CHUNK_ENTRIES // max(1, len(k) * d))
    while True:
        values, near = scores.topk(t, dim=1, largest=False)
        if t == K - 1 or bool((values[:, -1] > values[:, 0] + margin).all()):
            break
        if t >= most:  # many classes within rounding of the minimum (y ~ 0, duplicate rows): float64 throughout
            return _float64_scores(rows, k, y)
        t = min(2 * t, K - 1)
    exact = torch.einsum("bd,btd->bt", y, rows.gather(near))
    return scores.scatter_(1, near, torch.where(near == k[:, None], math.inf, exact))


def _float64_scores(rows: _UnitRows, k: Tensor, y: Tensor) -> Tensor:
    """<w_j, y> for every class j (b, K) in float64 (``rows.scores``, a chunk of W's rows at a time), +inf at j = k."""
    scores = rows.scores(y)
    scores[torch.arange(len(k), device=k.device), k] = math.inf
    return scores


def _pairwise_frank_wolfe(M: Tensor, lam: Tensor, steps: int) -> Tensor:
    """min_lambda lambda^T M lambda / 2 over simplices, batched: pairwise Frank-Wolfe, exact line search.

    Each step moves weight from the worst vertex in the support ("away") to the best vertex; it
    converges linearly on polytopes (Lacoste-Julien & Jaggi 2015). M: (b, m, m), lam: (b, m).
    """
    lam = lam.clone()
    rows = torch.arange(M.shape[0], device=M.device)
    columns = M.mT.contiguous()  # columns[r, j] = M[r, :, j], gathered as rows (M[rows, :, j] is a slow strided gather)
    g = (M @ lam[..., None]).squeeze(-1)
    tiny = torch.finfo(M.dtype).tiny
    for _ in range(steps):
        s = g.argmin(1)
        a = torch.where(lam > 0, g, -math.inf).argmax(1)
        away = lam[rows, a]
        curvature = (M[rows, s, s] + M[rows, a, a] - 2 * M[rows, s, a]).clamp_min(tiny)
        step = torch.minimum((g[rows, a] - g[rows, s]) / curvature, away).clamp_min(0)
        lam[rows, s] += step
        lam[rows, a] = torch.where(step >= away, 0.0, away - step)
        g += step[:, None] * (columns[rows, s] - columns[rows, a])
    return lam


def _wolfe_active_set(M: Tensor, lam: Tensor, tol: float) -> Tensor:
    """Wolfe's nearest-point algorithm, batched in lock-step and warm-started from a feasible lambda.

    Each iteration minimises ||y||^2 over the affine hull of the support ("corral"); if that point
    leaves the simplex, a minor cycle moves towards it up to the boundary and drops the blocking
    vertex; otherwise a major cycle adds the most violated candidate. A row is done when no candidate
    violates optimality by more than ``tol`` (in distance units).
    """
    rows = torch.arange(M.shape[0], device=M.device)
    support = lam > 0
    done = torch.zeros_like(support[:, 0])
    for _ in range(_WOLFE_ITERATIONS):
        idx, valid = _compact(support)
        current = lam.gather(1, idx)
        alpha = _affine_minimizer(M[rows[:, None, None], idx[:, :, None], idx[:, None, :]], valid, current)
        blocking = (alpha < 0) & valid
        minor = blocking.any(1) & ~done
        theta, j = torch.where(blocking, current / (current - alpha), math.inf).min(1)
        theta = torch.where(done, 0.0, torch.where(minor, theta, 1.0))
        new = torch.where(valid, (current + theta[:, None] * (alpha - current)).clamp_min(0), 0.0)
        new[rows[minor], j[minor]] = 0.0
        lam = torch.zeros_like(lam).scatter_(1, idx, new)
        lam /= lam.sum(1, keepdim=True)
        support = lam > 0
        g = (M @ lam[..., None]).squeeze(-1)
        norm2 = (lam * g).sum(1)
        gmin, jmin = g.min(1)
        violated = norm2 - gmin > tol * norm2.clamp_min(0).sqrt()
        major = ~minor & ~done & violated
        support[rows[major], jmin[major]] = True
        done |= ~minor & ~violated
        if done.all():
            break
    return lam


def _compact(mask: Tensor) -> tuple[Tensor, Tensor]:
    """Column indices with the True entries of each row first, cut to the largest count."""
    order = torch.argsort((~mask).to(torch.int8), dim=1, stable=True)
    idx = order[:, : max(1, int(mask.sum(1).max()))]
    return idx, mask.gather(1, idx)


def _affine_minimizer(Ms: Tensor, valid: Tensor, start: Tensor) -> Tensor:
    """argmin lambda^T Ms lambda over {sum lambda = 1, lambda = 0 off ``valid``}, batched.

    Proximal-point iterations lambda <- argmin lambda^T Ms lambda / 2 + delta/2 ||lambda - lambda_t||^2 on
    the affine set, each a Cholesky solve with one factorisation: exact in the limit even when the
    support's points are affinely dependent (Ms singular on the face), where a plain solve fails.
    """
    s = Ms.shape[-1]
    eye = torch.eye(s, dtype=Ms.dtype, device=Ms.device)
    diag = torch.where(valid, Ms.diagonal(dim1=1, dim2=2), 0.0)
    delta = (_PROXIMAL_DELTA * diag.amax(1)).clamp_min(torch.finfo(Ms.dtype).tiny)[:, None]
    A = torch.where(valid[:, :, None] & valid[:, None, :], Ms, eye) + delta[..., None] * eye
    L = torch.linalg.cholesky_ex(A).L
    ones = valid.to(Ms.dtype)
    u = torch.cholesky_solve(ones[..., None], L).squeeze(-1)
    lam = start
    for _ in range(_PROXIMAL_STEPS):
        v = torch.cholesky_solve((delta * lam)[..., None], L).squeeze(-1)
        nu = ((v * ones).sum(1, keepdim=True) - 1) / (u * ones).sum(1, keepdim=True)
        lam = torch.where(valid, v - nu * u, 0.0)
    return lam
