"""The exact one-vs-rest solver (see :mod:`kdcollapse.geometry._distances` for the maths), per block of classes:
candidates by similarity and float32 pairwise Frank-Wolfe (screening), float64 pairwise Frank-Wolfe then Wolfe's
nearest-point active-set method on the candidates, and the duality certificate against all K - 1 other classes,
with column generation for the classes whose gap exceeds ``tol``."""

from __future__ import annotations

import math
import warnings
from typing import NamedTuple

import torch
from torch import Tensor
from tqdm.auto import tqdm

from kdcollapse.geometry._rounding import _gamma, _ieee_float32_matmul
from kdcollapse.geometry._unit_rows import _CHUNK_ENTRIES, _UnitRows

_CANDIDATES = 128  # classes per QP before column generation (supports are ~70 for K=1e4, d=512)
_SCREEN_STEPS = 150  # float32 pairwise Frank-Wolfe steps used to pick candidates
_SOLVE_STEPS = 30  # float64 pairwise Frank-Wolfe steps before the active-set polish
_WOLFE_ITERATIONS = 300
_MAX_ROUNDS = 10  # column-generation rounds
_PRICE_EXTRA = 64  # classes beyond the support each round prices in (supports reach ~230 at d = 4096, K = 32,000)
_BLOCK_BYTES = 256 * 2**20
_PROXIMAL_DELTA = 1e-10  # relative ridge of the affine sub-problems (handles dependent supports)
_PROXIMAL_STEPS = 3
_SOLVE_ALL = 32  # up to this many classes (all candidates of each other) no screening: every QP solved from a vertex


class NearestPoints(NamedTuple):
    """Solution of the K one-vs-rest QPs (all float64, on the device of W)."""

    distances: Tensor  # (K,) ||w_k - P(w_k)||
    gaps: Tensor  # (K,) certified: true distance in [distance - gap, distance]
    offsets: Tensor  # (K, d) y_k = P(w_k) - w_k, P the projection onto conv{w_j : j != k}


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


def _block(K: int, d: int, m: int) -> int:
    """Classes per block so that the work arrays stay near ``_BLOCK_BYTES``."""
    return max(1, min(1024, _BLOCK_BYTES // (m * d * 12 + K * 16 + m * m * 8)))


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
