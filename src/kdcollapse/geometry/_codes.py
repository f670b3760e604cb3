"""Spherical codes: the simplex ETF, softmax codes (GNC Def. 2.1) and Tammes codes (GNC eq. 11).

Both codes maximise a minimum over the sphere, a non-smooth problem. We replace the minimum by its
log-sum-exp smoothing at temperature tau (Lemma A.1: tau * LSE(x / tau) -> max x as tau -> 0),
minimise it with L-BFGS over unconstrained parameters that are normalised onto the sphere, and lower
tau by decades down to 1e-7, warm-starting each stage (continuation). Restarts from random
points pick the best local optimum. Softmax codes are optimised in the HardMax form of the UFM
(eq. 5), jointly over the classifier W and one feature per class H; their value is then evaluated
exactly with :func:`one_vs_rest_distances`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor
from tqdm.auto import tqdm

from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry._bounds import check_sizes
from kdcollapse.geometry._distances import one_vs_one_distance, one_vs_rest_distances

# Continuation schedules of the smoothed max. Tammes starts less smooth: from tau = 0.1 every restart
# for K = 10, d = 3 falls into a 66.0856-degree local optimum; from 0.01 most find the 66.1468 optimum.
SOFTMAX_TEMPERATURES = tuple(10.0**-e for e in range(1, 8))
TAMMES_TEMPERATURES = tuple(10.0**-e for e in range(2, 8))


@dataclass
class SphericalCode:
    """K unit vectors in R^d found by :func:`softmax_code` or :func:`tammes_code`.

    Attributes:
        kind: ``"softmax"`` or ``"tammes"``.
        W: (K, d) float64 unit rows, the best restart.
        one_vs_rest: rho_one-vs-rest(W) = min_k dist(w_k, conv{w_j : j != k}) (Def. 2.1), certified.
        one_vs_one: rho_one-vs-one(W) = min_{k != k'} ||w_k - w_k'|| (eq. 11).
        restart_values: the objective reached by every restart (``value`` of each).
        features: softmax codes only: (K, d) features H of the HardMax solution (eq. 5) found with W.
    """

    kind: str
    W: Tensor
    one_vs_rest: float
    one_vs_one: float
    restart_values: list[float]
    features: Tensor | None = None

    @property
    def min_angle(self) -> float:
        """Smallest angle between two code vectors, in degrees."""
        return math.degrees(2 * math.asin(min(1.0, self.one_vs_one / 2)))

    @property
    def value(self) -> float:
        """The optimised objective: rho_one-vs-rest (softmax) or the minimal angle in degrees (Tammes)."""
        return self.one_vs_rest if self.kind == "softmax" else self.min_angle


def simplex_etf(num_classes: int, dim: int, *, dtype: torch.dtype = torch.float64) -> Tensor:
    """K unit vectors in R^d with pairwise cosine -1/(K-1): a simplex equiangular tight frame.

    DHKD App. B eq. 7 / GNC Thm 3.3: M = sqrt(K/(K-1)) U (I_K - 1 1^T / K); here U is an orthonormal
    basis of the (K-1)-dimensional subspace orthogonal to the all-ones vector, so K <= d + 1 suffices
    (eq. 7 asks d >= K). Returns (K, d) rows (coordinates beyond K - 1 are zero).
    """
    check_sizes(num_classes, dim)
    K = num_classes
    if K > dim + 1:
        raise KdcollapseError(f"a simplex ETF of K={K} vectors needs d >= K - 1, got d={dim}")
    centering = torch.eye(K, dtype=torch.float64) - 1 / K
    basis = torch.linalg.qr(centering[:, : K - 1]).Q  # orthonormal basis of the centred subspace
    W = torch.zeros(K, dim, dtype=torch.float64)
    W[:, : K - 1] = math.sqrt(K / (K - 1)) * basis
    return W.to(dtype)


def closed_form_code(num_classes: int, dim: int, *, dtype: torch.dtype = torch.float64) -> Tensor | None:
    """An optimal softmax code where GNC Theorem 3.3 gives one in closed form, else None; (K, d) unit rows.

    d = 2: the regular K-gon, rows in angular order (rows k and k + 1 mod K are neighbours);
    K <= d + 1: the simplex ETF; d + 1 < K <= 2d: e_1, -e_1, e_2, -e_2, ... (K vertices of the
    cross-polytope). Each is also a Tammes code (maximal minimal angle: the regular polygon, the simplex,
    and 90 degrees, Rankin's bound for d + 1 < K <= 2d). Softmax codes are not unique; these are one
    representative of each.
    """
    check_sizes(num_classes, dim)
    K, d = num_classes, dim
    if d == 2:
        angles = 2 * math.pi * torch.arange(K, dtype=torch.float64) / K
        return torch.stack([angles.cos(), angles.sin()], dim=1).to(dtype)
    if K <= d + 1:
        return simplex_etf(K, d, dtype=dtype)
    if K <= 2 * d:
        W = torch.zeros(K, d, dtype=dtype)
        rows = torch.arange(K)
        W[rows, rows // 2] = 1.0 - 2.0 * (rows % 2).to(dtype)
        return W
    return None


def softmax_code(
    num_classes: int,
    dim: int,
    *,
    restarts: int = 8,
    steps: int = 300,
    seed: int = 0,
    progress: bool = False,
) -> SphericalCode:
    """Numerically find a softmax code: max_W min_k dist(w_k, conv{w_j : j != k}) (GNC Def. 2.1).

    Minimises the smoothed HardMax objective of eq. 5 with one feature per class,
    tau * LSE_{k, k' != k}(<w_k' - w_k, h_k> / tau), whose minimisers are softmax codes (Thm 3.2).

    Args:
        num_classes, dim: K and d.
        restarts: random starting points; the best is returned.
        steps: L-BFGS iterations per temperature stage (tau = 1e-1, 1e-2, ..., 1e-7).
        seed: seeds the starting points.
        progress: tqdm bar over restarts.

    Example:
        >>> code = softmax_code(4, 3, restarts=1)  # K <= d + 1: a simplex ETF, rho = K / (K - 1)
        >>> round(code.one_vs_rest, 6)
        1.333333
    """
    return _best_of(num_classes, dim, restarts, seed, progress, "softmax", lambda V, U: _hardmax(V, U, steps))


def tammes_code(
    num_classes: int,
    dim: int,
    *,
    restarts: int = 8,
    steps: int = 300,
    seed: int = 0,
    progress: bool = False,
) -> SphericalCode:
    """Numerically solve the Tammes problem: max_W min_{k != k'} ||w_k - w_k'|| (GNC eq. 11).

    Minimises the smoothed largest cosine tau * LSE_{k < k'}(<w_k, w_k'> / tau) for tau = 1e-2, ..., 1e-7;
    arguments as in :func:`softmax_code`. ``value`` is the minimal angle in degrees.

    Example:
        >>> round(tammes_code(6, 3, restarts=1).min_angle, 4)  # the octahedron
        90.0
    """
    return _best_of(num_classes, dim, restarts, seed, progress, "tammes", lambda V, U: _tammes(V, steps))


def _best_of(K: int, d: int, restarts: int, seed: int, progress: bool, kind: str, solve: Callable) -> SphericalCode:
    check_sizes(K, d)
    if restarts < 1:
        raise KdcollapseError(f"restarts must be at least 1, got {restarts}")
    generator = torch.Generator().manual_seed(seed)
    best, values = None, []
    for _ in tqdm(range(restarts), desc=f"{kind} code K={K} d={d}", unit="restart", disable=not progress):
        V = torch.randn(K, d, generator=generator, dtype=torch.float64)
        U = torch.randn(K, d, generator=generator, dtype=torch.float64)
        W, H = solve(V, U)
        code = SphericalCode(kind, W, one_vs_rest_distances(W, tol=1e-12).min().item(), one_vs_one_distance(W), [], H)
        values.append(code.value)
        if best is None or code.value > best.value:
            best = code
    best.restart_values = values
    return best


def _tammes(V: Tensor, steps: int) -> tuple[Tensor, None]:
    rows, cols = torch.triu_indices(len(V), len(V), 1)
    V = V.clone().requires_grad_()

    def smoothed_max_cosine(tau: float) -> Tensor:
        W = F.normalize(V, dim=1)
        return tau * torch.logsumexp((W @ W.T)[rows, cols] / tau, 0)

    _anneal([V], smoothed_max_cosine, TAMMES_TEMPERATURES, steps)
    return F.normalize(V.detach(), dim=1), None


def _hardmax(V: Tensor, U: Tensor, steps: int) -> tuple[Tensor, Tensor]:
    off_diagonal = ~torch.eye(len(V), dtype=torch.bool)
    V, U = V.clone().requires_grad_(), U.clone().requires_grad_()

    def smoothed_hardmax(tau: float) -> Tensor:
        W, H = F.normalize(V, dim=1), F.normalize(U, dim=1)
        Z = H @ W.T  # Z[k, k'] = <h_k, w_k'>
        return tau * torch.logsumexp((Z - Z.diagonal()[:, None])[off_diagonal] / tau, 0)

    _anneal([V, U], smoothed_hardmax, SOFTMAX_TEMPERATURES, steps)
    return F.normalize(V.detach(), dim=1), F.normalize(U.detach(), dim=1)


def _anneal(params: list[Tensor], objective: Callable[[float], Tensor], temperatures: tuple, steps: int) -> None:
    """Minimise objective(tau) with L-BFGS for each tau in turn, warm-starting each stage."""
    for tau in temperatures:
        optimizer = torch.optim.LBFGS(
            params, max_iter=steps, history_size=10, tolerance_grad=1e-14, tolerance_change=1e-16,
            line_search_fn="strong_wolfe",
        )

        def closure() -> Tensor:
            optimizer.zero_grad()
            loss = objective(tau)
            loss.backward()
            return loss

        optimizer.step(closure)
