"""Tests of kdcollapse.metrics against slow, obviously-correct references and the papers' identities.

The references (numpy/scipy, every feature in memory) are written straight from the definitions in
the papers (Papyan et al. 2020, the VCI and GNC papers), under either convention for imbalanced classes documented in kdcollapse/metrics/_collapse.py
(tests/test_metrics_conventions.py: perfect collapse, continuity, pinned values, feature dtypes).
"""

from __future__ import annotations

import doctest
import math
import os
import socket
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from scipy.optimize import minimize

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import (
    METRICS,
    FeatureStatistics,
    NearestClassMeanAccuracy,
    collapse_metrics,
    mean_log_odds_gain,
    ncc_accuracy,
    psd_pinv,
)
from kdcollapse.geometry import softmax_code_optimum
from kdcollapse.metrics.functional import collapse_metrics_from_features
from kdcollapse.distributed import distributed_teardown
from test_metrics_catalog import names as catalogued

REPO = Path(__file__).resolve().parents[1]
# (np.testing rather than torch.testing.assert_close, whose first call costs seconds of lazy imports)

# ---------------------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------------------


def pinv(a: np.ndarray, rtol: float = 1e-10) -> np.ndarray:
    """Pseudo-inverse of a symmetric PSD matrix with a generous threshold (float64 data, exact ranks)."""
    values, vectors = np.linalg.eigh(a)
    keep = values > rtol * values.max()
    return (vectors[:, keep] / values[keep]) @ vectors[:, keep].T


def one_vs_rest(weight: np.ndarray) -> np.ndarray:
    """dist(w_k, conv{w_j : j != k}): minimise ||w_k - sum_j lambda_j w_j||^2 over the simplex (SLSQP)."""
    out = []
    for k in range(len(weight)):
        a = np.delete(weight, k, axis=0).T
        m = a.shape[1]

        def objective(lam, a=a, k=k):
            return 0.5 * np.sum((weight[k] - a @ lam) ** 2)

        def gradient(lam, a=a, k=k):
            return -(a.T @ (weight[k] - a @ lam))

        result = minimize(
            objective, np.full(m, 1 / m), jac=gradient, method="SLSQP", bounds=[(0, None)] * m,
            constraints=[{"type": "eq", "fun": lambda lam: lam.sum() - 1, "jac": np.ones_like}],
            options={"ftol": 1e-16, "maxiter": 1000},
        )
        out.append(np.linalg.norm(weight[k] - a @ result.x))
    return np.array(out)


def make_features(counts, dim, *, seed, spread=3.0, offset=0.0, dtype=torch.float64):
    """Gaussian classes with anisotropic within-class noise, shuffled. Returns (features, labels, means)."""
    g = torch.Generator().manual_seed(seed)
    num_classes = len(counts)
    means = torch.randn(num_classes, dim, generator=g, dtype=torch.float64) * spread
    mixing = torch.randn(dim, dim, generator=g, dtype=torch.float64) / dim**0.5
    labels = torch.repeat_interleave(torch.arange(num_classes), torch.tensor(counts))
    labels = labels[torch.randperm(len(labels), generator=g)]
    noise = torch.randn(len(labels), dim, generator=g, dtype=torch.float64) @ mixing
    return (means[labels] + noise + offset).to(dtype), labels, means


def reference_metrics(features, labels, num_classes, weight=None, convention="papyan") -> dict[str, float]:
    """Every metric from its definition; ``convention`` picks Sigma_B's class weights and centre (NC1,
    fuzziness, squared distance, GNC1): 1/K about the mean of class means, or pi_k about the sample mean."""
    h = np.asarray(features, dtype=np.float64)
    y = np.asarray(labels)
    n, dim = h.shape
    k_all = range(num_classes)
    prior = np.bincount(y, minlength=num_classes) / n
    means = np.stack([h[y == k].mean(0) for k in k_all])
    mu_g = h.mean(0)
    mu_bar = means.mean(0)  # the centre of the class means, where NC2 / NC3 put the simplex ETF's centre
    weights, centre = (prior, mu_g) if convention == "prior" else (np.full(num_classes, 1 / num_classes), mu_bar)
    within = sum(np.outer(h[i] - means[y[i]], h[i] - means[y[i]]) for i in range(n)) / n
    between = sum(weights[k] * np.outer(means[k] - centre, means[k] - centre) for k in k_all)
    sample_between = sum(prior[k] * np.outer(means[k] - mu_g, means[k] - mu_g) for k in k_all)  # VCI's
    total = sum(np.outer(h[i] - mu_g, h[i] - mu_g) for i in range(n)) / n
    onehot = np.eye(num_classes)[y]
    design = np.hstack([h - mu_g, np.ones((n, 1))])  # same minimum as [h, 1] (the intercept absorbs mu_g)
    coef = np.linalg.lstsq(design, onehot, rcond=None)[0]
    out = {
        "nc1": np.trace(within @ pinv(between)) / num_classes,
        "fuzziness": np.trace(within @ pinv(between)),
        "vci": 1 - np.trace(pinv(total) @ sample_between) / min(dim, num_classes - 1),
        "linear_probe_mse": np.sum((design @ coef - onehot) ** 2) / (2 * n),
        "squared_distance": sum(np.sum((h[i] - means[y[i]]) ** 2) for i in range(n)) / n
        / sum(weights[k] * np.sum((means[k] - centre) ** 2) for k in k_all),
    }
    u = h / np.linalg.norm(h, axis=1, keepdims=True)
    cos_distance = 1 - u @ u.T
    d_within = np.mean([cos_distance[np.ix_(y == k, y == k)].mean() for k in k_all])
    d_total = np.mean([[cos_distance[np.ix_(y == j, y == k)].mean() for k in k_all] for j in k_all])
    out["cosine_within"], out["class_separation"] = d_within, 1 - d_within / d_total
    out["nc2_equinorm"], out["nc2_equiangle"] = equinorm_equiangle(means - mu_bar)
    out["nc2_etf_error"] = etf_error(means - mu_bar, means - mu_bar)
    variances = [np.mean(np.sum((h[y == k] - means[k]) ** 2, axis=1)) for k in k_all]
    out["cdnv"] = np.mean([(variances[a] + variances[b]) / (2 * np.sum((means[a] - means[b]) ** 2))
                           for a in k_all for b in k_all if a < b])
    unit_means = np.stack([u[y == k].mean(0) for k in k_all])
    unit_within = sum(np.outer(u[i] - unit_means[y[i]], u[i] - unit_means[y[i]]) for i in range(n)) / n
    unit_between = sum(weights[k] * np.outer(unit_means[k], unit_means[k]) for k in k_all)  # uncentred
    out["gnc1"] = np.trace(unit_within @ pinv(unit_between)) / num_classes
    if weight is not None:
        w = np.asarray(weight, dtype=np.float64)
        w_unit = w / np.linalg.norm(w, axis=1, keepdims=True)
        out["nc2_equinorm_w"], out["nc2_equiangle_w"] = equinorm_equiangle(w)
        m = means - mu_bar
        out["nc3"] = np.sum((w / np.linalg.norm(w) - m / np.linalg.norm(m)) ** 2)
        out["nc3_self_duality"] = etf_error(m, w)
        out["gnc2"] = one_vs_rest(w_unit).min()
        out["gnc3"] = np.mean([1 - w_unit[k] @ unit_means[k] for k in k_all])
        out["classifier_zero_rows"] = int(np.sum(~np.any(w != 0, axis=1)))
    return out


def equinorm_equiangle(vectors: np.ndarray) -> tuple[float, float]:
    norms = np.linalg.norm(vectors, axis=1)
    num = len(vectors)
    pairs = [(a, b) for a in range(num) for b in range(num) if a != b]
    cosines = [vectors[a] @ vectors[b] / (norms[a] * norms[b]) for a, b in pairs]
    return norms.std(ddof=1) / norms.mean(), np.mean(np.abs(np.array(cosines) + 1 / (num - 1)))


def etf_error(a: np.ndarray, b: np.ndarray) -> float:
    """||S/||S||_F - (I - 11^T/K)/sqrt(K-1)||_F with S = b a^T, the K x K matrix written out."""
    num = len(a)
    s = b @ a.T
    etf = (np.eye(num) - np.ones((num, num)) / num) / np.sqrt(num - 1)
    return np.linalg.norm(s / np.linalg.norm(s) - etf)


def stream(features, labels, num_classes, batch=17, **kwargs) -> FeatureStatistics:
    stats = FeatureStatistics(num_classes, features.shape[1], **kwargs)
    for start in range(0, len(labels), batch):
        stats.update(features[start : start + batch], labels[start : start + batch])
    return stats


def assert_same_metrics(ours: dict, expected: dict, rel: float, names=None) -> None:
    for name in names or expected:
        assert float(ours[name]) == pytest.approx(float(expected[name]), rel=rel, abs=1e-13), name


FEATURE_METRICS = (
    "nc1", "fuzziness", "vci", "linear_probe_mse", "squared_distance", "cosine_within", "class_separation",
    "nc2_equinorm", "nc2_equiangle", "gnc1", "nc2_etf_error", "cdnv",
)
# (class counts, d): d > K-1 leaves Sigma_B rank-deficient; d < K-1 makes it full rank.
CASES = {"balanced": ([30] * 5, 8), "imbalanced": ([5, 40, 12, 3, 25, 9], 4)}


# ---------------------------------------------------------------------------------------------------
# Every metric against the references
# ---------------------------------------------------------------------------------------------------


# Checked against closed forms below instead of reference_metrics: the ranks and the GNC2 optimum.
CLOSED_FORMS = {"rank_between", "rank_total", "rank_between_unit", "vci_rank", "gnc2_optimum"}
# Checked in tests/test_metrics_rhubarbwu.py against a transcription of rhubarbwu/neural-collapse and float64 loops.
RHUBARBWU_CHECKED = {m.name for m in METRICS if m.name.startswith("nc2g_")} | {"nc1_svd", "unc3", "unc3_cosine"}


@pytest.mark.parametrize("convention", ["papyan", "prior"])
@pytest.mark.parametrize("case", CASES)
def test_metrics_match_reference(case, convention):
    counts, dim = CASES[case]
    num_classes = len(counts)
    h, y, _ = make_features(counts, dim, seed=1)
    w = torch.randn(num_classes, dim, dtype=torch.float64)
    ours = collapse_metrics(stream(h, y, num_classes, convention=convention), w)
    expected = reference_metrics(h, y, num_classes, w, convention)
    assert set(ours) == catalogued(source="collapse_metrics", needs_ood=False)
    missing = set(ours) - set(expected) - CLOSED_FORMS - RHUBARBWU_CHECKED
    assert not missing, f"give reference_metrics a slow reference of {sorted(missing)}"
    assert_same_metrics(ours, expected, rel=1e-10, names=[n for n in expected if n != "gnc2"])
    assert float(ours["gnc2"]) == pytest.approx(expected["gnc2"], rel=1e-7)
    assert int(ours["rank_between"]) == min(dim, num_classes - 1) == int(ours["vci_rank"])
    assert int(ours["rank_total"]) == dim
    assert int(ours["rank_between_unit"]) == min(dim, num_classes)
    assert float(ours["gnc2_optimum"]) == softmax_code_optimum(num_classes, dim)  # the geometry's closed form
    # Without a classifier, compute() gives the same feature metrics; the convention can be given late.
    assert_same_metrics(stream(h, y, num_classes, convention=convention).compute(), expected, 1e-10, FEATURE_METRICS)
    late = collapse_metrics(stream(h, y, num_classes), convention=convention)
    assert_same_metrics(late, expected, rel=1e-10, names=FEATURE_METRICS)


def test_linear_probe_mse_is_theorem_5_1_and_vci_respects_theorem_5_2():
    # The least-squares minimum itself is checked against np.linalg.lstsq in test_metrics_match_reference.
    num_classes = 5
    h, y, _ = make_features([30] * num_classes, 8, seed=2)
    m = collapse_metrics(stream(h, y, num_classes))
    explained = (1 - m["vci"]) * m["vci_rank"]  # Tr(Sigma_T^+ Sigma_B)
    theorem_5_1 = -explained / (2 * num_classes) + 0.5 - 1 / (2 * num_classes)
    assert float(m["linear_probe_mse"]) == pytest.approx(float(theorem_5_1), rel=1e-12)
    assert 0 < float(explained) < int(m["rank_between"])  # Thm 5.2, strict away from collapse


def simplex_etf(num_classes: int, dim: int) -> torch.Tensor:
    """Unit rows of a simplex ETF embedded in R^dim (DHKD App. B eq. 7 / GNC Thm 3.3)."""
    etf = torch.eye(num_classes, dtype=torch.float64) - 1 / num_classes
    etf = torch.nn.functional.pad(etf, (0, dim - num_classes))
    return etf / etf.norm(dim=1, keepdim=True)


def test_fully_collapsed_features_attain_every_bound():
    num_classes, dim = 4, 6
    etf = simplex_etf(num_classes, dim)
    y = torch.arange(num_classes).repeat(7)
    m = collapse_metrics(stream(5.0 * etf[y], y, num_classes, batch=5), classifier_weight=2.0 * etf)
    for name in ("nc1", "fuzziness", "vci", "linear_probe_mse", "squared_distance", "cosine_within", "gnc1",
                 "nc2_equinorm", "nc2_equiangle", "nc2_equinorm_w", "nc2_equiangle_w", "nc3", "gnc3"):
        assert abs(float(m[name])) < 1e-12, name
    assert float(m["class_separation"]) == pytest.approx(1.0)
    # Thm 5.2's bound is attained: Tr(Sigma_T^+ Sigma_B) = rank(Sigma_B) = K - 1 (so VCI = 0 above).
    assert int(m["rank_between"]) == int(m["rank_total"]) == num_classes - 1
    assert float(m["gnc2"]) == pytest.approx(num_classes / (num_classes - 1), rel=1e-9)
    assert float(m["gnc2_optimum"]) == num_classes / (num_classes - 1)


def circle(num_classes: int) -> torch.Tensor:
    angles = torch.arange(num_classes, dtype=torch.float64) * 2 * math.pi / num_classes
    return torch.stack([angles.cos(), angles.sin()], dim=1)


@pytest.mark.parametrize(
    ("weight", "optimum"),
    [
        (simplex_etf(5, 7), 5 / 4),  # K <= d + 1
        (circle(7), 1 - math.cos(2 * math.pi / 7)),  # d = 2, uniform on the circle
        (torch.cat([torch.eye(3), -torch.eye(3)[:2]]), 1.0),  # d + 1 < K <= 2d, cross-polytope vertices
    ],
)
def test_gnc2_of_known_softmax_codes(weight, optimum):
    num_classes, dim = weight.shape
    h, y, _ = make_features([6] * num_classes, dim, seed=3)
    m = collapse_metrics(stream(h, y, num_classes), weight.double())
    assert float(m["gnc2"]) == pytest.approx(optimum, rel=1e-7)
    assert float(m["gnc2_optimum"]) == pytest.approx(optimum, rel=1e-12)
    unknown = torch.nn.functional.normalize(torch.randn(100, 10, dtype=torch.float64), dim=1)
    assert math.isnan(float(collapse_metrics(stream(*make_features([2] * 100, 10, seed=4)[:2], 100), unknown)["gnc2_optimum"]))


# ---------------------------------------------------------------------------------------------------
# Invariances
# ---------------------------------------------------------------------------------------------------


def orthogonal(dim: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.linalg.qr(torch.randn(dim, dim, generator=g, dtype=torch.float64))[0]


def test_vci_is_invariant_to_invertible_linear_maps_but_fuzziness_is_not():
    num_classes, dim = 5, 8
    h, y, _ = make_features([25] * num_classes, dim, seed=4)
    scales = torch.diag(torch.linspace(-1, 1, dim, dtype=torch.float64).exp())
    a = orthogonal(dim, seed=1) @ scales @ orthogonal(dim, seed=2)
    a = a + torch.ones(dim, dim, dtype=torch.float64).triu(1)  # add a shear: not a rotation-and-scale
    base = collapse_metrics(stream(h, y, num_classes))
    mapped = collapse_metrics(stream(h @ a.T, y, num_classes))
    assert_same_metrics(mapped, base, rel=1e-9, names=["vci", "linear_probe_mse"])  # VCI Cor. 5.4, Obs. 4.5
    assert float(mapped["fuzziness"]) != pytest.approx(float(base["fuzziness"]), rel=1e-2)  # VCI Obs. 4.2


def test_feature_metrics_are_invariant_to_orthogonal_maps_and_scaling():
    num_classes, dim = 6, 4
    h, y, _ = make_features([5, 40, 12, 3, 25, 9], dim, seed=5)
    q = orthogonal(dim, seed=3)
    base = collapse_metrics(stream(h, y, num_classes))
    assert_same_metrics(collapse_metrics(stream(7.5 * h @ q.T, y, num_classes)), base, 1e-9, FEATURE_METRICS)


# ---------------------------------------------------------------------------------------------------
# Streaming and merging
# ---------------------------------------------------------------------------------------------------


def test_streaming_one_shot_merged_halves_and_forward_agree():
    num_classes, dim = 6, 5
    h, y, _ = make_features([5, 40, 12, 3, 25, 9], dim, seed=6, offset=100.0)
    # Two halves holding every class: a shuffled one, and one sorted by descending label, so their first
    # batches (hence their shifts) differ.
    rank_in_class = torch.zeros_like(y)
    for k in range(num_classes):
        rank_in_class[y == k] = torch.arange(int((y == k).sum()))
    a = (rank_in_class % 2 == 0).nonzero().flatten()
    b = (rank_in_class % 2 == 1).nonzero().flatten()
    b = b[torch.argsort(y[b], descending=True, stable=True)]
    h, y, half = h[torch.cat([a, b])], y[torch.cat([a, b])], len(a)
    whole = collapse_metrics_from_features(h, y, num_classes)
    assert_same_metrics(collapse_metrics(stream(h, y, num_classes, batch=7)), whole, 1e-10, FEATURE_METRICS)

    first, second = stream(h[:half], y[:half], num_classes), stream(h[half:], y[half:], num_classes)
    assert (first.shift - second.shift).norm() > 1.0
    first_alone = first.compute()  # a cached result must not survive the merge
    first.merge_state(second)
    assert_same_metrics(first.compute(), whole, 1e-10, FEATURE_METRICS)

    empty = FeatureStatistics(num_classes, dim)
    empty.merge_state(stream(h[half:], y[half:], num_classes).metric_state)
    empty.merge_state(stream(h[:half], y[:half], num_classes))
    assert_same_metrics(collapse_metrics(empty), whole, 1e-10, FEATURE_METRICS)

    forwarded = FeatureStatistics(num_classes, dim)
    assert_same_metrics(forwarded(h[:half], y[:half]), first_alone, 1e-10, FEATURE_METRICS)
    forwarded.update(h[half:], y[half:])
    assert_same_metrics(forwarded.compute(), whole, 1e-10, FEATURE_METRICS)


@pytest.mark.parametrize(("dtype", "offset"), [(torch.float32, 1e4), (torch.float64, 1e8)])
def test_large_offset_with_rank_deficient_sigma_b_gives_true_values(dtype, offset):
    num_classes, dim = 10, 64  # d > K - 1: Sigma_B has rank 9 of 64
    h, y, _ = make_features([40] * num_classes, dim, seed=7, offset=offset, dtype=dtype)
    truth = reference_metrics(h.double(), y, num_classes)  # float64, two-pass, exact-rank pseudo-inverses
    ours = collapse_metrics(stream(h, y, num_classes, batch=64))
    raw = ("nc1", "fuzziness", "vci", "linear_probe_mse", "squared_distance", "nc2_equinorm", "nc2_equiangle")
    assert_same_metrics(ours, truth, rel=1e-6, names=raw)  # at 1e8, unshifted float64 moments are garbage
    assert int(ours["rank_between"]) == num_classes - 1
    if dtype != torch.float32:
        return
    # What an all-in-memory float32 implementation with numpy's default pinv reports:
    x, labels = h.numpy(), y.numpy()
    means = np.stack([x[labels == k].mean(0) for k in range(num_classes)])
    centred = means - x.mean(0)
    sigma_b = centred.T @ centred / num_classes
    sigma_w = (x - means[labels]).T @ (x - means[labels]) / len(x)
    naive_nc1 = np.trace(sigma_w @ np.linalg.pinv(sigma_b)) / num_classes
    assert sigma_b.dtype == np.float32
    assert not 1e-3 < abs(naive_nc1) / truth["nc1"] < 1e3, naive_nc1  # wrong by orders of magnitude


# ---------------------------------------------------------------------------------------------------
# Pseudo-inverse, NC4, mean log-odds gain
# ---------------------------------------------------------------------------------------------------


def test_psd_pinv_rank_and_threshold():
    g = torch.Generator().manual_seed(8)
    basis = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))[0]
    values = torch.tensor([5.0, 2.0, 1.0, 1e-9, 0.0, -1e-14], dtype=torch.float64)
    a = basis @ torch.diag(values) @ basis.T
    assert psd_pinv(a)[1] == 4  # default rtol = n * eps(float64): 1e-9 is resolvable
    assert psd_pinv(a.float())[1] == 3  # n * eps(float32) = 7e-7: it is not
    inverse, rank = psd_pinv(a, rtol=1e-6)
    assert rank == 3
    exact = basis[:, :3] @ torch.diag(1 / values[:3]) @ basis[:, :3].T
    np.testing.assert_allclose(inverse, exact, rtol=1e-9, atol=1e-9)
    assert psd_pinv(a, rank=2)[1] == 2
    assert psd_pinv(a, rtol=0.3)[1] == 2  # 1.0 <= 0.3 * 5.0 is dropped
    with pytest.raises(KdcollapseError, match="non-positive"):
        psd_pinv(a, rank=5)
    with pytest.raises(KdcollapseError, match="square"):
        psd_pinv(torch.zeros(2, 3))


def test_both_gram_paths_keep_the_same_upper_triangle():
    from kdcollapse.metrics._linalg import symmetric_from_upper
    from kdcollapse.metrics._statistics import _add_gram

    z = torch.randn(9, 5, dtype=torch.float64)
    blas_path = torch.full((5, 5), 2.0, dtype=torch.float64)  # contiguous CPU: dsyrk
    matmul_path = torch.full((5, 5), 2.0, dtype=torch.float64).T  # not contiguous: addmm_ (as on GPU)
    for moment in (blas_path, matmul_path):
        _add_gram(moment, z)
        np.testing.assert_allclose(symmetric_from_upper(moment), 2.0 + z.T @ z, rtol=1e-12)


@pytest.mark.parametrize("accumulate", ["float64", "float32"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_update_in_blocks_gives_the_states_of_the_definitions(monkeypatch, accumulate, dtype):
    """update in blocks of 3 rows (BLOCK_ELEMENTS, MIN_BLOCK_ROWS; the last block of a batch shorter), Grams
    included, against every state written out from its definition in float64 numpy, over three batches."""
    from kdcollapse.metrics import _statistics
    from kdcollapse.metrics._linalg import symmetric_from_upper

    num_classes, dim, first = 4, 7, 20
    g = torch.Generator().manual_seed(11)
    h = (torch.randn(50, dim, generator=g) + 3.0).to(dtype)
    h[5] = 0.0  # a zero row is a zero unit vector, as with F.normalize
    y = torch.randint(num_classes, (50,), generator=g)
    given = h.clone()
    monkeypatch.setattr(_statistics, "BLOCK_ELEMENTS", 3 * dim)
    monkeypatch.setattr(_statistics, "MIN_BLOCK_ROWS", 1)
    batches = [slice(0, first), slice(first, 48), slice(48, 50)]  # blocks of 3 rows; the last of 2, 1, 2
    stats = FeatureStatistics(num_classes, dim, accumulate=accumulate)
    for rows in batches:
        stats.update(h[rows], y[rows])
    assert torch.equal(h, given)  # the caller's tensor, float64 ones included, is never written to

    x, labels = h.double().numpy(), y.numpy()
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    unit = np.divide(x, norms, out=np.zeros_like(x), where=norms > 0)
    raw_shift, unit_shift = x[:first].mean(0), unit[:first].mean(0)
    for z, shift, names in ((x, raw_shift, ("shift", "class_sums", "moment")),
                            (unit, unit_shift, ("unit_shift", "unit_class_sums", "unit_moment"))):
        shift_name, sums, moment = names
        np.testing.assert_allclose(getattr(stats, shift_name), shift, rtol=1e-13, err_msg=shift_name)
        centred = z - shift
        expected = np.stack([centred[labels == k].sum(0) for k in range(num_classes)])
        rtol = 1e-12 if accumulate == "float64" else 1e-6
        assert getattr(stats, sums).dtype == getattr(torch, accumulate)
        np.testing.assert_allclose(getattr(stats, sums).double(), expected, rtol=rtol, atol=rtol, err_msg=sums)
        np.testing.assert_allclose(symmetric_from_upper(getattr(stats, moment)), centred.T @ centred, rtol=1e-12,
                                   atol=1e-12, err_msg=moment)
        if sums == "class_sums":
            squares = [(centred[labels == k] ** 2).sum() for k in range(num_classes)]
            np.testing.assert_allclose(stats.class_square_sums, squares, rtol=1e-12)
    np.testing.assert_array_equal(stats.class_counts, np.bincount(labels, minlength=num_classes))

    # One block per batch (the whole batch at once) gives the same states to rounding.
    monkeypatch.setattr(_statistics, "BLOCK_ELEMENTS", 10**9)
    whole = FeatureStatistics(num_classes, dim, accumulate=accumulate)
    for rows in batches:
        whole.update(h[rows], y[rows])
    for name, value in whole.metric_state.items():
        np.testing.assert_allclose(getattr(stats, name), value, rtol=1e-13, atol=1e-12, err_msg=name)


def test_ncc_accuracy_matches_brute_force_nearest_mean():
    num_classes = 4
    h, y, _ = make_features([20] * num_classes, 3, seed=9, spread=1.0, offset=1e4, dtype=torch.float32)
    means = stream(h, y, num_classes).class_means()
    logits = torch.randn(len(y), num_classes)
    distances = ((h.double()[:, None, :] - means[None]) ** 2).sum(-1)
    nearest = distances.argmin(1)
    ours = ncc_accuracy(h, y, means, logits)
    assert float(ours["ncc_accuracy"]) == pytest.approx(float((nearest == y).double().mean()))
    assert float(ours["ncc_agreement"]) == pytest.approx(float((nearest == logits.argmax(1)).double().mean()))
    assert 0.3 < float(ours["ncc_accuracy"]) < 1.0  # overlapping classes: not a trivial case
    metric = NearestClassMeanAccuracy(means)
    for start in range(0, len(y), 11):
        metric.update(h[start : start + 11], y[start : start + 11], logits[start : start + 11])
    assert {k: float(v) for k, v in metric.compute().items()} == {k: float(v) for k, v in ours.items()}
    assert math.isnan(float(ncc_accuracy(h, y, means)["ncc_agreement"]))


# VCI paper Table 1 (downstream accuracies, %, and their mean log odds) and Table 2 (pretrain accuracy, MLOG).
VCI_TABLES = [
    ([90.8, 95.03, 58.85, 64.73, 74.47, 93.1, 75.45, 77.14, 84.9, 62.44], 1.445, 75.4, 0.3250),
    ([91.52, 95.25, 57.5, 64.1, 74.41, 92.89, 75.41, 77.65, 85.58, 63.28], 1.459, 76.64, 0.2704),
    ([91.64, 94.66, 57.67, 64.42, 74.63, 92.58, 74.97, 77.1, 85.59, 63.3], 1.441, 77.53, 0.2029),
    ([91.74, 94.14, 57.54, 61.56, 76.22, 92.42, 74.86, 76.6, 85.2, 63.51], 1.421, 77.72, 0.1711),
    ([92.35, 93.52, 55.64, 61.6, 75.37, 92.37, 74.2, 76.07, 84.49, 62.74], 1.39, 77.83, 0.1343),
    ([91.7, 93.68, 55.37, 60.14, 73.99, 91.9, 74.42, 75.96, 85.82, 62.98], 1.375, 77.88, 0.1161),
    ([90.86, 92.01, 51.07, 55.14, 74.36, 91.79, 72.9, 75.44, 85.19, 62.01], 1.282, 77.52, 0.0440),
    ([90.87, 90.79, 47.81, 50.44, 76.01, 91.89, 72.19, 75.31, 82.97, 60.98], 1.22, 77.31, -0.0063),
    ([90.51, 90.03, 45.12, 50.52, 74.41, 91.63, 71.84, 74.64, 82.63, 60.38], 1.174, 77.29, -0.0507),
    ([89.33, 86.54, 44.52, 46.87, 73.14, 91.64, 71.19, 74.13, 81.23, 58.55], 1.08, 77.46, -0.1539),
]


@pytest.mark.parametrize(("downstream", "mean_log_odds", "pretrain", "mlog"), VCI_TABLES)
def test_mean_log_odds_gain_reproduces_vci_paper_tables(downstream, mean_log_odds, pretrain, mlog):
    accs = torch.tensor(downstream, dtype=torch.float64) / 100
    assert float(torch.logit(accs).mean()) == pytest.approx(mean_log_odds, abs=1.5e-3)
    assert mean_log_odds_gain(accs, pretrain / 100) == pytest.approx(mlog, abs=1.5e-3)


# ---------------------------------------------------------------------------------------------------
# Bad input
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("features", "labels", "message"),
    [
        (torch.zeros(4, 3), torch.tensor([0, 1, 2, 3]), r"labels \[3\] are out of range; valid .* 0..2"),
        (torch.zeros(4, 3), torch.tensor([0, -1, 2, 1]), r"labels \[-1\] are out of range"),
        (torch.tensor([[0.0, 1, 2], [math.nan, 0, 0]]), torch.tensor([0, 1]),
         r"NaN or inf in 1 of 2 rows \(first: row 1\)"),
        (torch.tensor([[0.0, 1, 2], [0, float("inf"), 0]]), torch.tensor([0, 1]), "NaN or inf"),
        (torch.zeros(4), torch.tensor([0, 1, 2, 0]), r"features must have shape \(B, 3\), got \(4,\)"),
        (torch.zeros(4, 5), torch.tensor([0, 1, 2, 0]), r"shape \(B, 3\), got \(4, 5\)"),
        (torch.zeros(4, 3), torch.tensor([0, 1, 2]), r"labels must have shape \(4,\)"),
        (torch.zeros(2, 3), torch.tensor([0.0, 1.0]), "integer class indices"),
        (torch.zeros(2, 3, dtype=torch.int64), torch.tensor([0, 1]), "floating-point"),
        (np.zeros((2, 3)), torch.tensor([0, 1]), "torch tensors"),
    ],
)
def test_bad_batches_are_rejected(features, labels, message):
    stats = FeatureStatistics(3, 3)
    with pytest.raises(KdcollapseError, match=message):
        stats.update(features, labels)
    assert int(stats.class_counts.sum()) == 0  # nothing was accumulated


def test_bad_configurations_are_rejected():
    with pytest.raises(KdcollapseError, match="num_classes >= 2"):
        FeatureStatistics(1, 4)
    with pytest.raises(KdcollapseError, match="feature_dim"):
        FeatureStatistics(3, 0)
    with pytest.raises(KdcollapseError, match=r"rtol must lie in \[0, 1\)"):
        FeatureStatistics(3, 4, rtol=2.0)
    stats = FeatureStatistics(4, 3)
    with pytest.raises(KdcollapseError, match="no samples: call update"), pytest.warns(UserWarning):
        stats.compute()
    stats.update(torch.randn(6, 3), torch.tensor([0, 0, 1, 3, 3, 1]))
    with pytest.raises(KdcollapseError, match=r"1 of 4 classes have no samples \(classes 2\)"):
        stats.compute()
    stats.update(torch.randn(2, 3), torch.tensor([2, 2]))
    with pytest.raises(KdcollapseError, match=r"classifier_weight must be a \(K, d\) = \(4, 3\) tensor"):
        collapse_metrics(stats, torch.zeros(3, 4))
    with pytest.raises(KdcollapseError, match="NaN or inf"):
        collapse_metrics(stats, torch.full((4, 3), float("nan")))
    with pytest.raises(KdcollapseError, match="unknown convention 'uniform'; choose one of papyan, prior"):
        FeatureStatistics(3, 4, convention="uniform")
    with pytest.raises(KdcollapseError, match="unknown convention 'balanced'"):
        collapse_metrics(stats, convention="balanced")
    with pytest.raises(KdcollapseError, match="takes a FeatureStatistics or its metric_state, not list"):
        stats.merge_state([1, 2])
    with pytest.raises(KdcollapseError, match=r"of \(K, d\) = \(5, 3\) into \(4, 3\)"):
        stats.merge_state(FeatureStatistics(5, 3))
    with pytest.raises(KdcollapseError, match=r"lacks \['moment'\]"):
        stats.merge_state({k: v for k, v in stats.metric_state.items() if k != "moment"})
    with pytest.raises(KdcollapseError, match="divide percentages by 100"):
        mean_log_odds_gain([75.0, 80.0], 70.0)
    with pytest.raises(KdcollapseError, match="at least one"):
        mean_log_odds_gain([], 0.5)
    with pytest.raises(KdcollapseError, match=r"logits must have shape \(2, 2\)"):
        ncc_accuracy(torch.zeros(2, 3), torch.tensor([0, 1]), torch.eye(2, 3), logits=torch.zeros(2, 3))
    with pytest.raises(KdcollapseError, match="class_means contain NaN"):
        NearestClassMeanAccuracy(torch.full((2, 3), float("nan")))


# ---------------------------------------------------------------------------------------------------
# Documentation examples
# ---------------------------------------------------------------------------------------------------


def test_docs_examples_run():
    """The examples of docs/metrics.md (the modules' docstring examples run under --doctest-modules)."""
    docs = str(REPO / "docs" / "metrics.md")
    result = doctest.testfile(docs, module_relative=False, globs={"torch": torch})
    assert result.failed == 0 and result.attempted > 5


# ---------------------------------------------------------------------------------------------------
# Two gloo processes equal one process
# ---------------------------------------------------------------------------------------------------


def _distributed_data():
    """Sorted by label, so rank 0 (low classes) and rank 1 (high classes) start from different shifts."""
    h, y, _ = make_features([9, 14, 6, 11, 8], 6, seed=10, offset=50.0, dtype=torch.float32)
    order = torch.argsort(y, stable=True)
    w = torch.randn(5, 6, generator=torch.Generator().manual_seed(11))
    return h[order], y[order], w


def _phases(n: int, rank: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rank r's rows: its contiguous shard, alternately in a first phase and in a second one after a sync."""
    shard = torch.arange(rank * n // world, (rank + 1) * n // world)
    return shard[0::2], shard[1::2]


def _gloo_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    with distributed_teardown():
        h, y, w = _distributed_data()
        stats = FeatureStatistics(5, 6)
        results = {}
        for phase, rows in enumerate(_phases(len(y), rank, world)):
            for batch in rows.split(4):
                stats.update(h[batch], y[batch])
            if phase == 0:
                results["means"] = stats.class_means()
            results[f"phase{phase}"] = collapse_metrics(stats, w)
        results["compute"] = stats.compute()
        torch.save(results, os.path.join(out_dir, f"rank{rank}.pt"))


def test_two_gloo_processes_equal_one_process(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    # fork: the workers inherit the imported modules instead of importing torch again (seconds each).
    mp.start_processes(_gloo_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    h, y, w = _distributed_data()
    first_rows = torch.cat([_phases(len(y), rank, 2)[0] for rank in range(2)])
    single_first = stream(h[first_rows], y[first_rows], 5, batch=4)
    expected_first = collapse_metrics(single_first, w)
    expected_all = collapse_metrics(stream(h, y, 5, batch=4), w)
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert_same_metrics(got["phase0"], expected_first, rel=1e-9)
        assert_same_metrics(got["phase1"], expected_all, rel=1e-9)
        assert_same_metrics(got["compute"], expected_all, rel=1e-9, names=FEATURE_METRICS)
        np.testing.assert_allclose(got["means"], single_first.class_means(), rtol=1e-12, atol=1e-9)
