"""Geometry: exact one-vs-rest distances, bounds, simplex ETF, softmax and Tammes codes (GNC paper)."""

import math

import numpy as np
import pytest
import torch
from scipy.optimize import nnls

from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry import (
    one_vs_one_distance,
    one_vs_rest_distances,
    optimal_features,
    simplex_etf,
    softmax_code,
    softmax_code_bounds,
    softmax_code_optimum,
    tammes_code,
)
from kdcollapse.geometry import _distances


def reference_distances(W: np.ndarray) -> np.ndarray:
    """Slow, independent reference: one non-negative least-squares problem per class.

    min_{mu >= 0} ||P^T mu||^2 + (1^T mu - 1)^2 with P the rows w_j - w_k: writing mu = t * lambda,
    lambda in the simplex, the value t^2 a + (t - 1)^2 (a = ||P^T lambda||^2) is minimised at
    t = 1/(1 + a) where it equals a/(1 + a), increasing in a. So mu/sum(mu) solves the QP of eq. 3 exactly.
    """
    W = W / np.linalg.norm(W, axis=1, keepdims=True)
    K, d = W.shape
    out = []
    for k in range(K):
        P = np.delete(W, k, axis=0) - W[k]
        mu, _ = nnls(np.vstack([P.T, np.ones((1, K - 1))]), np.r_[np.zeros(d), 1.0], maxiter=50 * K)
        out.append(np.linalg.norm(P.T @ (mu / mu.sum())))
    return np.array(out)


def circle(K: int) -> torch.Tensor:
    angles = 2 * math.pi * torch.arange(K, dtype=torch.float64) / K
    return torch.stack([angles.cos(), angles.sin()], 1)


def random_rotation(d: int, seed: int = 0) -> torch.Tensor:
    return torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)).Q


# --- closed forms of GNC Thm 3.3 (distances, not squared distances) -------------------------------


@pytest.mark.parametrize("K", [3, 4, 5, 8, 40])
def test_uniform_circle_distance_is_one_minus_cos(K):
    # The nearest point of conv(others) is the midpoint of the two neighbours, at radius cos(2 pi / K).
    expected = 1 - math.cos(2 * math.pi / K)
    assert torch.allclose(one_vs_rest_distances(circle(K) @ random_rotation(2)), torch.full((K,), expected, dtype=torch.float64), atol=1e-12)
    assert softmax_code_optimum(K, 2) == pytest.approx(expected)


@pytest.mark.parametrize("K,d", [(2, 1), (3, 2), (4, 3), (5, 7), (10, 9)])
def test_simplex_etf_distance_is_k_over_k_minus_one(K, d):
    W = simplex_etf(K, d) @ random_rotation(d, seed=K)
    gram = W @ W.T
    assert torch.allclose(gram, torch.full((K, K), -1 / (K - 1), dtype=torch.float64) + torch.eye(K, dtype=W.dtype) * K / (K - 1), atol=1e-12)
    assert torch.allclose(one_vs_rest_distances(W), torch.full((K,), K / (K - 1), dtype=torch.float64), atol=1e-12)
    assert softmax_code_optimum(K, d) == pytest.approx(K / (K - 1))


@pytest.mark.parametrize("K,d", [(5, 3), (6, 3), (9, 6), (12, 6)])
def test_cross_polytope_subsets_have_distance_one(K, d):
    g = torch.Generator().manual_seed(K)
    vertices = torch.cat([torch.eye(d), -torch.eye(d)]).double()[torch.randperm(2 * d, generator=g)[:K]]
    assert torch.allclose(one_vs_rest_distances(vertices @ random_rotation(d)), torch.ones(K, dtype=torch.float64), atol=1e-12)
    assert softmax_code_optimum(K, d) == 1.0


def test_simplex_etf_rejects_too_many_classes():
    with pytest.raises(KdcollapseError, match="d >= K - 1"):
        simplex_etf(5, 3)


# --- against the slow reference, with the certificate ----------------------------------------------


@pytest.mark.parametrize("K,d", [(2, 3), (3, 2), (12, 3), (40, 5), (150, 8), (60, 80)])
def test_matches_nnls_reference_and_certificate_holds(K, d):
    W = torch.randn(K, d, generator=torch.Generator().manual_seed(K * d), dtype=torch.float64)
    dist, gap = one_vs_rest_distances(W, return_certificate=True)
    ref = reference_distances(W.numpy())
    error = dist.numpy() - ref
    assert np.abs(error).max() < 1e-10
    assert (gap >= 0).all() and gap.max() < 1e-9
    assert (error <= gap.numpy() + 1e-13).all()  # the distance is feasible: never below the truth


def test_certificate_bounds_the_error_of_a_poor_solution():
    # Uniform weights are feasible but far from optimal: the gap must still cover the true error.
    W = _distances.unit_rows(torch.randn(30, 4, generator=torch.Generator().manual_seed(3), dtype=torch.float64))
    k = torch.arange(30)
    cand = torch.stack([torch.cat([torch.arange(i), torch.arange(i + 1, 30)]) for i in range(30)])
    lam = torch.full(cand.shape, 1 / 29, dtype=torch.float64)
    y, gap, _ = _distances._certify(_distances._UnitRows(W), k, lam, W[cand] - W[k][:, None, :])
    error = y.norm(dim=1).numpy() - reference_distances(W.numpy())
    assert error.min() > 1e-3  # genuinely suboptimal
    assert (error <= gap.numpy() + 1e-13).all()


def test_column_generation_finds_supports_outside_the_candidates():
    W = torch.randn(50, 10, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    dist, gap = one_vs_rest_distances(W, return_certificate=True, candidates=2, block_size=7)
    assert np.abs(dist.numpy() - reference_distances(W.numpy())).max() < 1e-10
    assert gap.max() < 1e-9


def test_scale_dtype_and_duplicates():
    W = torch.randn(25, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    scaled = (W * torch.rand(25, 1, dtype=torch.float64) * 10).float()
    assert torch.allclose(one_vs_rest_distances(scaled), one_vs_rest_distances(W.float().double()), atol=1e-12)
    W[7] = 3 * W[4]  # two classes with the same direction are at distance 0, certified
    dist, gap = one_vs_rest_distances(W, return_certificate=True)
    assert dist[4] < 1e-15 and dist[7] < 1e-15 and gap.max() < 1e-9


@pytest.mark.parametrize(
    "W,message",
    [
        (torch.ones(5), "matrix"),
        (torch.ones(1, 3), "at least 2 classes"),
        (torch.tensor([[1.0, 0.0], [float("nan"), 1.0]]), "NaN"),
        (torch.tensor([[1.0, 0.0], [0.0, 0.0]]), "zero rows"),
    ],
)
def test_bad_matrices_are_rejected(W, message):
    with pytest.raises(KdcollapseError, match=message):
        one_vs_rest_distances(W)


def test_one_vs_one_distance_matches_brute_force():
    W = torch.randn(50, 4, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    U = W / W.norm(dim=1, keepdim=True)
    brute = torch.cdist(U, U) + torch.eye(50, dtype=U.dtype) * 9
    assert one_vs_one_distance(W) == pytest.approx(brute.min().item(), abs=1e-14)


def test_optimal_features_attain_lemma_c4():
    # min_{|h|=1} max_{k' != k} <w_k' - w_k, h> = -dist_k, attained by h_k (eq. C.18, C.19).
    W = _distances.unit_rows(torch.randn(20, 3, generator=torch.Generator().manual_seed(4), dtype=torch.float64))
    H = optimal_features(W)
    dist = one_vs_rest_distances(W)
    margins = (H @ W.T) - (H * W).sum(1, keepdim=True)  # [k, k'] = <w_k' - w_k, h_k>
    margins.fill_diagonal_(-math.inf)
    assert torch.allclose(margins.max(1).values, -dist, atol=1e-12)
    trials = torch.nn.functional.normalize(torch.randn(20, 500, 3, dtype=torch.float64), dim=2)
    others = (trials @ W.T) - (trials * W[:, None, :]).sum(2, keepdim=True)
    others[torch.arange(20), :, torch.arange(20)] = -math.inf
    assert (others.max(2).values >= -dist[:, None] - 1e-12).all()


# --- bounds (Thm 3.9) --------------------------------------------------------------------------------


@pytest.mark.parametrize("K,d", [(10, 2), (100, 3), (50, 7)])
def test_bounds_formula(K, d):
    g = math.gamma
    lower = 0.5 * ((math.sqrt(math.pi) / K) * g((d + 1) / 2) / g(d / 2 + 1)) ** (2 / (d - 1))
    upper = 2 * ((2 * math.sqrt(math.pi) / K) * g((d + 1) / 2) / g(d / 2)) ** (1 / (d - 1))
    b = softmax_code_bounds(K, d)
    assert (b.lower, b.upper) == (pytest.approx(lower, rel=1e-12), pytest.approx(upper, rel=1e-12))
    assert b.valid


def test_bounds_validity_and_errors():
    assert not softmax_code_bounds(4, 3).valid  # sqrt(2 pi sqrt(e) 3) = 5.57 > 4
    assert softmax_code_bounds(6, 3).valid
    assert softmax_code_bounds(10_000, 512).lower > 0  # log-gamma: no overflow at large d
    with pytest.raises(KdcollapseError, match="d >= 2"):
        softmax_code_bounds(10, 1)
    with pytest.raises(KdcollapseError, match="K must be an integer >= 2"):
        softmax_code_bounds(1, 3)


def test_bounds_hold_for_the_circle():
    for K in range(5, 200):
        b = softmax_code_bounds(K, 2)
        assert b.lower <= 1 - math.cos(2 * math.pi / K) <= b.upper


# --- numerical codes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("K,d", [(5, 2), (4, 3), (6, 3), (8, 4)])
def test_softmax_code_reaches_the_closed_forms(K, d):
    code = softmax_code(K, d, restarts=1, steps=100)
    assert code.one_vs_rest == pytest.approx(softmax_code_optimum(K, d), abs=1e-6)
    assert torch.allclose(code.W.norm(dim=1), torch.ones(K, dtype=torch.float64))


def test_softmax_code_obeys_theorems_3_5_and_3_9():
    code = softmax_code(7, 3, restarts=1, steps=100)
    b = softmax_code_bounds(7, 3)
    assert b.valid and b.lower <= code.one_vs_rest <= b.upper
    assert code.one_vs_rest == pytest.approx(code.restart_values[0])
    # Thm 3.5: each non-rattler feature of the HardMax solution is normalise(w_k - P(w_k)).
    dist = one_vs_rest_distances(code.W)
    non_rattler = dist < dist.min() + 1e-6
    assert non_rattler.sum() >= 2
    error = (code.features - optimal_features(code.W)).norm(dim=1)
    assert error[non_rattler].max() < 1e-5


@pytest.mark.parametrize(
    "K,d,degrees",
    [(4, 3, 109.4712206), (6, 3, 90.0), (8, 3, 74.8584922), (12, 3, 63.4349488), (10, 4, 80.4059318),
     pytest.param(24, 3, 43.6907671, marks=pytest.mark.slow)],
)
def test_tammes_code_reaches_proven_optima(K, d, degrees):
    code = tammes_code(K, d, restarts=1, steps=200)
    assert code.min_angle == pytest.approx(degrees, abs=1e-3)
    assert code.one_vs_one == pytest.approx(2 * math.sin(math.radians(degrees) / 2), abs=1e-5)


def test_the_best_restart_is_returned():
    code = tammes_code(5, 3, restarts=3, steps=20)
    assert len(code.restart_values) == 3 and code.value == max(code.restart_values)


def test_codes_reject_bad_sizes():
    with pytest.raises(KdcollapseError, match="K must be"):
        tammes_code(1, 3)
    with pytest.raises(KdcollapseError, match="restarts"):
        softmax_code(4, 2, restarts=0)
