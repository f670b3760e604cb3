"""GNC2's screening (:func:`kdcollapse.geometry.min_one_vs_rest_distance`): rigorous upper and lower bounds of every
class's one-vs-rest distance from bfloat16 or float32 K-wide products with their rounding subtracted, and their
tightening by float32 column generation for the classes near the minimum; only the classes these bounds cannot
exclude go to the exact solver."""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import Tensor

from kdcollapse.geometry._rounding import _gamma, _ieee_float32_matmul, _product_error
from kdcollapse.geometry._solver import _BLOCK_BYTES, _candidates, _float64_scores, _price, _screen_weights
from kdcollapse.geometry._unit_rows import _UnitRows

_REFINE_ROUNDS = 2  # float32 column-generation rounds for the classes the screening leaves near the minimum
_WINDOW = 4096  # most classes per row whose bfloat16 scores a certificate recomputes in float32 ...
_WINDOW_SHARE = 64  # ... and at most K / _WINDOW_SHARE: a larger window's gather costs more than a K-wide product


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
