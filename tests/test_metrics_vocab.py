"""Collapse metrics at vocabulary scale: tiles and Gram identities against the dense K x K definitions,
against rhubarbwu/neural-collapse (the library of Wu & Papyan's "Linguistic Collapse") and against the
official GNC code's centring, on identical inputs.

The two reference implementations below are literal transcriptions, in float64 numpy, of the official
computations (cited by repository, path and commit); their code is not vendored or imported.
"""

from __future__ import annotations

import math
import weakref

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import FeatureStatistics, NearestClassMeanAccuracy, collapse_metrics, nearest_class_mean
from kdcollapse.metrics._pairwise import cdnv, equiangle, etf_error, pair_mean
from kdcollapse.metrics.functional import collapse_metrics_from_features

RHUBARBWU = "rhubarbwu/neural-collapse@c05a0b80d6bc6e8e2e102f2180f1f33b2c9605fd"
GNC_OFFICIAL = "kongwanbianjinyu/Neural-Collapse-For-Large-Number-of-Classes@037dc062a1432a11db0a56839e0b84327e27637d"


def gaussian_classes(counts, dim, *, seed, spread=2.0, offset=0.0):
    g = torch.Generator().manual_seed(seed)
    means = torch.randn(len(counts), dim, generator=g, dtype=torch.float64) * spread
    labels = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    labels = labels[torch.randperm(len(labels), generator=g)]
    features = means[labels] + torch.randn(len(labels), dim, generator=g, dtype=torch.float64) + offset
    return features, labels


# ---------------------------------------------------------------------------------------------------
# Tiles and Gram identities against the K x K matrices written out
# ---------------------------------------------------------------------------------------------------


def dense_equiangle(v: np.ndarray) -> float:
    u = v / np.linalg.norm(v, axis=1, keepdims=True)
    cos = u @ u.T
    off = ~np.eye(len(v), dtype=bool)
    return float(np.abs(cos[off] + 1 / (len(v) - 1)).mean())


def dense_cdnv(means: np.ndarray, variances: np.ndarray) -> float:
    num = len(means)
    values = [(variances[a] + variances[b]) / (2 * np.sum((means[a] - means[b]) ** 2))
              for a in range(num) for b in range(a + 1, num)]
    return float(np.mean(values))


def dense_etf_error(a: np.ndarray, b: np.ndarray) -> float:
    num = len(a)
    s = b @ a.T
    target = (np.eye(num) - 1 / num) / math.sqrt(num - 1)
    return float(np.linalg.norm(s / np.linalg.norm(s) - target))


@pytest.mark.parametrize("tile", [1, 3, 7, 16, 4096])
@pytest.mark.parametrize("num_classes, dim", [(2, 3), (13, 5), (40, 64)])
def test_tiled_metrics_equal_the_dense_definitions(num_classes, dim, tile):
    g = torch.Generator().manual_seed(num_classes * 100 + tile)
    means = torch.randn(num_classes, dim, generator=g, dtype=torch.float64) + 3
    variances = torch.rand(num_classes, generator=g, dtype=torch.float64)
    weight = torch.randn(num_classes, dim, generator=g, dtype=torch.float64)
    m, v, w = means.numpy(), variances.numpy(), weight.numpy()
    centred = m - m.mean(0)
    assert float(equiangle(means, tile)) == pytest.approx(dense_equiangle(m), rel=1e-12)
    assert float(cdnv(means, variances, tile)) == pytest.approx(dense_cdnv(m, v), rel=1e-10)
    assert float(etf_error(torch.from_numpy(centred))) == pytest.approx(
        dense_etf_error(centred, centred), rel=1e-9, abs=1e-12)
    assert float(etf_error(torch.from_numpy(centred), weight)) == pytest.approx(dense_etf_error(centred, w), rel=1e-9)
    # pair_mean visits each unordered pair once: the mean of i + j over i < j.
    rows = torch.arange(num_classes, dtype=torch.float64)[:, None]
    expected = np.mean([a + b for a in range(num_classes) for b in range(a + 1, num_classes)])
    assert float(pair_mean(rows, lambda a, b: a + b.mT, tile)) == pytest.approx(expected, rel=1e-14)


def test_etf_error_is_zero_on_a_simplex_etf_and_self_dual_classifier():
    num = 7
    etf = torch.eye(num, dtype=torch.float64) - 1 / num
    assert float(etf_error(etf)) < 1e-14  # NC2 from eigenvalues: no cancellation at the optimum
    assert float(etf_error(etf @ torch.randn(num, 3 * num, dtype=torch.float64))) > 0.1
    assert float(etf_error(etf, etf)) < 3e-8  # NC3: 2 - 2 cos leaves sqrt(eps)
    assert float(etf_error(etf, 3 * etf)) < 3e-8  # any scale of the classifier
    assert float(etf_error(etf, -etf)) == pytest.approx(2.0)  # the opposite frame


@pytest.mark.parametrize("accumulate", ["float64", "float32"])
@pytest.mark.parametrize("tile, chunk", [(1, 8192), (5, 2), (2048, 3), (2048, 8192)])
def test_collapse_metrics_do_not_depend_on_the_tile_or_the_chunk(monkeypatch, tile, chunk, accumulate):
    """Tiles of the pairwise kernels and chunks of the rows formed from the states (``LazyRows``: the K x d
    matrices of the metric phase, never held whole) change only the order of float64 sums."""
    import kdcollapse.metrics._linalg as linalg

    h, y = gaussian_classes([9, 14, 3, 7, 11, 5, 8], 6, seed=3, offset=4.0)
    w = torch.randn(7, 6, dtype=torch.float64)
    stats = FeatureStatistics(7, 6, accumulate=accumulate)
    stats.update(h, y)
    w = w.to(stats.class_sums.dtype)
    reference = collapse_metrics(stats, w, tile=2048)
    means = stats.class_means()
    monkeypatch.setattr(linalg, "CHUNK_ROWS", chunk)
    monkeypatch.setattr(linalg, "GRAM_BLOCK", 4)  # the d x d Grams by blocks of 4 and 2 columns
    tiled = collapse_metrics(stats, w, tile=tile)
    rel = 1e-12 if accumulate == "float64" else 1e-6  # float32 rows: the chunked sums round differently
    for key, value in reference.items():
        assert float(tiled[key]) == pytest.approx(float(value), rel=rel, abs=1e-15), key
    assert torch.equal(stats.class_means(), means)


def test_equiangle_and_cdnv_in_one_pass_equal_the_two_kernels_and_the_dense_definitions():
    """NC2's equiangularity and CDNV from one pass over the centred means' Gram tiles equal ``equiangle`` (unit
    rows) and ``cdnv`` and the dense definitions, also with a class mean at the centre (a zero row: cosine 0
    with every row, as ``F.normalize`` gives) and tiles that do not divide K."""
    from kdcollapse.metrics._pairwise import cdnv, equiangle, equiangle_and_cdnv

    g = np.random.default_rng(21)
    means = g.normal(size=(9, 5)) + 2.0
    means[4] = np.delete(means, 4, axis=0).mean(0)  # its centred row is zero
    variances = g.uniform(0.5, 2.0, size=9)
    centred = torch.from_numpy(means - means.mean(0))
    unit = centred.numpy() / np.maximum(np.linalg.norm(centred.numpy(), axis=1, keepdims=True), 1e-12)
    dense_angle = float(np.abs((unit @ unit.T)[~np.eye(9, dtype=bool)] + 1 / 8).mean())
    for tile in (2, 4, 2048):
        angle, spread = equiangle_and_cdnv(centred, torch.from_numpy(variances), tile)
        assert float(angle) == pytest.approx(float(equiangle(centred, tile)), rel=1e-12)
        assert float(angle) == pytest.approx(dense_angle, rel=1e-12)
        assert float(spread) == pytest.approx(float(cdnv(torch.from_numpy(means), torch.from_numpy(variances))),
                                              rel=1e-12)
        assert float(spread) == pytest.approx(dense_cdnv(means, variances), rel=1e-10)


@pytest.mark.parametrize("block", [1, 3, 7, 40])
def test_symmetric_gram_by_upper_blocks_equals_the_full_product(monkeypatch, block):
    """``cross_gram`` of one matrix (weighted or not, float64 whole or float32 in chunks) forms only the
    column blocks on and above the diagonal and mirrors them: equal to the float64 product A^T diag(w) A."""
    import kdcollapse.metrics._linalg as linalg

    monkeypatch.setattr(linalg, "GRAM_BLOCK", block)
    monkeypatch.setattr(linalg, "CHUNK_ROWS", 50)
    g = torch.Generator().manual_seed(5)
    a = torch.randn(120, 23, generator=g, dtype=torch.float64)
    weights = torch.rand(120, generator=g, dtype=torch.float64)
    for rows in (a, a.float()):
        exact = rows.double().mT @ (rows.double() * weights[:, None])
        assert torch.allclose(linalg.cross_gram(rows, weights=weights), exact, rtol=1e-13, atol=1e-13)
        assert torch.allclose(linalg.cross_gram(rows), rows.double().mT @ rows.double(), rtol=1e-13, atol=1e-13)


def test_class_square_sums_merge_exactly_across_shifts():
    h, y = gaussian_classes([20, 30, 25], 4, seed=5, offset=1e3)
    whole = FeatureStatistics(3, 4)
    whole.update(h, y)
    first, second = FeatureStatistics(3, 4), FeatureStatistics(3, 4)
    first.update(h[:40], y[:40])
    second.update(h[40:] + 0, y[40:])
    first.merge_state(second)
    assert float(collapse_metrics(first)["cdnv"]) == pytest.approx(float(collapse_metrics(whole)["cdnv"]), rel=1e-9)


def test_nearest_class_mean_in_blocks_equals_one_block(monkeypatch):
    import kdcollapse.metrics._ncc as ncc

    g = torch.Generator().manual_seed(0)
    means, features = torch.randn(50, 4, generator=g), torch.randn(333, 4, generator=g)
    whole = nearest_class_mean(features, means)
    monkeypatch.setattr(ncc, "_SCORES", 50 * 7)  # blocks of 7 rows
    assert torch.equal(nearest_class_mean(features, means), whole)
    brute = torch.cdist(features.double(), means.double()).argmin(1)
    assert torch.equal(whole, brute)


# ---------------------------------------------------------------------------------------------------
# rhubarbwu/neural-collapse, transcribed literally (neural_collapse/measure.py, kernels.py, util.py,
# accumulate.py at RHUBARBWU): their accumulators (class means, the within-class covariance and
# per-class variance norms from a second pass against those means), covariance_ratio(metric="pinv"),
# simplex_etf_error, self_duality_error, variability_cdnv and the DecAccumulator's manual NCC path.
# ---------------------------------------------------------------------------------------------------


def rhubarbwu_measures(x: np.ndarray, y: np.ndarray, num: int, w: np.ndarray) -> dict[str, float]:
    # MeanAccumulator.accumulate / compute(weighted=False): class means, m_G the mean of the class means
    eps = np.finfo(np.float64).eps
    ns = np.bincount(y, minlength=num).astype(np.float64)
    totals = np.eye(num)[y].T @ x
    means = totals / (ns + eps)[:, None]
    m_g = means.mean(axis=0)
    # CovarAccumulator: sum (X - M[Y])^T (X - M[Y]) / (sum ns + eps)
    diff = x - means[y]
    v_intra = diff.T @ diff / (ns.sum() + eps)
    # VarNormAccumulator: per-class sum of squared deviations; compute() divides by ns + eps
    v_norms = (np.eye(num)[y].T @ diff**2).sum(-1) / (ns + eps)
    # covariance_ratio(metric="pinv"): trace(pinv(V_inter) @ V_intra) / K
    m_c = means - m_g
    v_inter = m_c.T @ m_c / num
    nc1 = np.trace(np.linalg.pinv(v_inter) @ v_intra) / num

    # structure_error(A, B): struct = B @ A^T / ||.||_F; += 1/K/sqrt(K-1); diag -= 1/sqrt(K-1)
    def structure_error(a, b):
        struct = b @ a.T
        struct = struct / np.linalg.norm(struct)
        struct = struct + 1 / num / math.sqrt(num - 1)
        struct[np.diag_indices(num)] -= 1 / math.sqrt(num - 1)
        return np.linalg.norm(struct)

    # class_dist_norm_vars (dist_exp = 1) on the full grid, then symm_reduce(grid, sum)
    with np.errstate(divide="ignore"):  # the diagonal, which symm_reduce skips
        grid = ((v_norms[:, None] + v_norms[None, :]) / 2) / np.sum((means[:, None] - means[None]) ** 2, axis=-1)
    total = 0.0
    for i in range((num - 1) // 2):
        total += np.sum(np.concatenate([grid[i][i + 1:], grid[num - i - 2][num - i - 1:]]))
    if num % 2 == 0:
        total += np.sum(grid[num // 2 - 1][num // 2:])
    cdnv_value = total / (num * (num - 1) / 2)
    # DecAccumulator.accumulate without FAISS: NCC from |x|^2 + |m|^2 - 2 x.m, linear from argmax X W^T
    dists = np.sum(x**2, 1)[:, None] + np.sum(means**2, 1)[None] - 2 * x @ means.T
    agreement = np.mean((x @ w.T).argmax(-1) == dists.argmin(-1))
    return {"nc1": nc1, "nc2_etf_error": structure_error(m_c, m_c), "nc3_self_duality": structure_error(m_c, w),
            "cdnv": cdnv_value, "ncc_agreement": agreement}


@pytest.mark.parametrize("counts, dim", [([40] * 12, 8), ([5, 60, 17, 33, 8, 21, 12, 9], 16)])
def test_equal_to_rhubarbwu_neural_collapse_on_identical_inputs(counts, dim):
    num = len(counts)
    h, y = gaussian_classes(counts, dim, seed=11)
    w = torch.randn(num, dim, dtype=torch.float64)
    stats = FeatureStatistics(num, dim)
    stats.update(h, y)
    ours = collapse_metrics(stats, w)
    nearest = NearestClassMeanAccuracy(stats.class_means())
    nearest.update(h, y, logits=h @ w.T)  # LM heads have no bias, as their argmax X W^T
    ours |= nearest.compute()
    theirs = rhubarbwu_measures(h.numpy(), y.numpy(), num, w.numpy())
    for key, value in theirs.items():
        assert float(ours[key]) == pytest.approx(value, rel=1e-9), (RHUBARBWU, key)


# ---------------------------------------------------------------------------------------------------
# The official GNC code's centring (GNC1.py, GNC3.py at GNC_OFFICIAL), transcribed literally:
# unit features; mu_G = sum of unit features / N; mu_c = class sums / n_c; Sigma_W = sum (h - mu_y)(.)^T / N;
# Sigma_B = sum_c (mu_c - mu_G)(.)^T / K; GNC1 = trace(Sigma_W @ scipy.linalg.pinv(Sigma_B)) / K;
# GNC3 = mean_k (1 - <normalize(mu_k - mu_G), normalize(w_k)>).
# ---------------------------------------------------------------------------------------------------


def official_gnc(x: np.ndarray, y: np.ndarray, num: int, w: np.ndarray) -> dict[str, float]:
    from scipy import linalg as scilin

    u = x / np.linalg.norm(x, axis=1, keepdims=True)
    mu_g = u.sum(0) / len(u)
    mu_c = np.stack([u[y == c].sum(0) / np.sum(y == c) for c in range(num)])
    sigma_w = sum(np.outer(u[i] - mu_c[y[i]], u[i] - mu_c[y[i]]) for i in range(len(u))) / len(u)
    sigma_b = sum(np.outer(mu_c[c] - mu_g, mu_c[c] - mu_g) for c in range(num)) / num
    gnc1 = np.trace(sigma_w @ scilin.pinv(sigma_b)) / num
    h_mean = mu_c - mu_g
    h_mean /= np.linalg.norm(h_mean, axis=1, keepdims=True)
    w_unit = w / np.linalg.norm(w, axis=1, keepdims=True)
    gnc3 = np.mean([1 - h_mean[k] @ w_unit[k] for k in range(num)])
    return {"gnc1": gnc1, "gnc3": gnc3}


@pytest.mark.parametrize("counts, dim", [([30] * 6, 10), ([30] * 12, 5), ([8, 50, 19, 27, 11], 7)])
def test_official_gnc_convention_equals_the_official_code(counts, dim):
    num = len(counts)
    h, y = gaussian_classes(counts, dim, seed=2, offset=0.7)
    w = torch.randn(num, dim, dtype=torch.float64)
    ours = collapse_metrics_from_features(h, y, num, w, gnc_convention="official")
    official = official_gnc(h.numpy(), y.numpy(), num, w.numpy())
    for key, value in official.items():
        assert float(ours[key]) == pytest.approx(value, rel=1e-9), (GNC_OFFICIAL, key)
    paper = collapse_metrics_from_features(h, y, num, w)
    assert float(paper["gnc3"]) != pytest.approx(official["gnc3"], rel=1e-3)  # the conventions do differ here


def test_official_gnc1_is_continuous_under_a_growing_common_offset_and_the_paper_one_jumps():
    """The issue's probe: collapsed ETF features (d > K) plus small noise, shifted by a growing common
    offset. The paper's uncentred Sigma_B gains the offset's direction once the Hotelling test counts it
    (docs/metrics.md): GNC1 jumps there. The official centred Sigma_B never has that direction."""
    num, dim, per = 6, 10, 40
    etf = torch.zeros(num, dim, dtype=torch.float64)
    etf[:, :num] = torch.eye(num, dtype=torch.float64) - 1 / num
    g = torch.Generator().manual_seed(4)
    y = torch.arange(num).repeat_interleave(per)
    noise = 1e-3 * torch.randn(len(y), dim, generator=g, dtype=torch.float64)
    direction = torch.zeros(dim, dtype=torch.float64)
    direction[-1] = 1.0
    scales = [0.0] + [1e-5 * 1.33**i for i in range(50)]
    paper, official = [], []
    for scale in scales:
        h = etf[y] + noise + scale * direction
        paper.append(float(collapse_metrics_from_features(h, y, num)["gnc1"]))
        official.append(float(collapse_metrics_from_features(h, y, num, gnc_convention="official")["gnc1"]))
    steps = lambda values: max(abs(b - a) / max(abs(a), 1e-12) for a, b in zip(values, values[1:]))
    assert steps(official) < 0.5  # no jump: each 1.33x step changes it by less than half
    assert steps(paper) > 10  # the documented jump where the offset becomes significant


def test_bad_gnc_convention_and_tile_are_rejected():
    with pytest.raises(KdcollapseError, match="unknown gnc_convention 'offical'; choose one of paper, official"):
        FeatureStatistics(3, 2, gnc_convention="offical")
    stats = FeatureStatistics(3, 2)
    stats.update(torch.randn(6, 2), torch.tensor([0, 1, 2, 0, 1, 2]))
    with pytest.raises(KdcollapseError, match="tile must be a positive integer, got 0"):
        collapse_metrics(stats, tile=0)


# ---------------------------------------------------------------------------------------------------
# GNC2 at scale: screening, then the exact solver only where the minimum can be
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("num_classes, dim, offset", [(300, 8, 0.0), (200, 16, 0.5), (40, 3, 0.0), (6, 10, 0.0)])
def test_screened_gnc2_equals_the_exact_solver_on_every_class(num_classes, dim, offset):
    from kdcollapse.geometry import min_one_vs_rest_distance, one_vs_rest_distances

    g = torch.Generator().manual_seed(num_classes)
    weight = torch.randn(num_classes, dim, generator=g, dtype=torch.float64) + offset
    every = one_vs_rest_distances(weight)
    screened = min_one_vs_rest_distance(weight, candidates=16)
    assert float(screened.value) == pytest.approx(float(every.min()), abs=1e-9)
    assert bool((screened.upper >= every - 1e-9).all()) and bool((screened.lower <= every + 1e-9).all())
    assert int(every.argmin()) in screened.solved.tolist()
    assert float(screened.gap) <= 1e-10


@pytest.mark.parametrize("kind", ["gaussian", "relu", "offset", "duplicate"])
def test_small_k_solves_every_class_without_screening_and_equals_the_screened_path(kind):
    """For K <= 32 classes (all candidates of each other) GNC2 and the distances skip the screening and its
    Frank-Wolfe warm start and solve every class from its most similar one: the same distances, certificates
    and minimum as the screened path (forced by fewer candidates than K - 1)."""
    from kdcollapse.geometry import min_one_vs_rest_distance, nearest_points

    g = torch.Generator().manual_seed(11)
    num, dim = 30, 24
    weight = torch.randn(num, dim, generator=g, dtype=torch.float64)
    weight = {"gaussian": weight, "relu": weight.relu() + 1e-3, "offset": weight + 3.0,
              "duplicate": torch.cat([weight[:-1], 2 * weight[:1]])}[kind]
    fast, screened = nearest_points(weight), nearest_points(weight, candidates=num - 2)
    torch.testing.assert_close(fast.distances, screened.distances, rtol=0, atol=1e-12)
    assert float(fast.gaps.max()) <= 1e-10 and float(screened.gaps.max()) <= 1e-10
    small = min_one_vs_rest_distance(weight)
    assert small.solved.tolist() == list(range(num))  # every class solved: no screening
    forced = min_one_vs_rest_distance(weight, candidates=num - 2, screen_candidates=num - 2)
    assert len(forced.solved) < num
    assert float(small.value) == pytest.approx(float(forced.value), abs=1e-12)
    assert float(small.value) == pytest.approx(float(screened.distances.min()), abs=1e-12)
    assert bool((small.lower <= fast.distances + 1e-12).all()) and bool((small.upper >= fast.distances - 1e-12).all())
    assert bool((small.lower <= small.upper).all())
    assert float(small.gap) <= 1e-10
    if kind == "duplicate":
        assert float(small.value) == 0.0


@pytest.mark.parametrize("weight_dtype", [torch.float64, torch.float32])
def test_float32_screening_bounds_are_below_the_float64_certificate_by_at_most_twice_its_rounding_bound(
        monkeypatch, weight_dtype):
    from kdcollapse.geometry import _distances, _rounding, _screening, one_vs_rest_distances

    g = torch.Generator().manual_seed(5)
    num, dim, m = 300, 48, 32
    weight = (torch.randn(num, dim, generator=g, dtype=torch.float64) + 0.5).to(weight_dtype)
    rows, k = _distances._UnitRows(weight), torch.arange(num)
    assert _rounding._ieee_float32_matmul(rows.device)
    upper32, lower32, *_ = _screening._screen_bounds(rows, k, m, rows.W32)  # one float32 product against all classes
    monkeypatch.setattr(_screening, "_ieee_float32_matmul", lambda device: False)
    upper64, lower64, *_ = _screening._screen_bounds(rows, k, m, rows.W32)  # float64 scores, as the exact certificate
    exact = one_vs_rest_distances(weight)
    gamma = (dim + 4) * 2.0**-24 / (1 - (dim + 4) * 2.0**-24)
    assert torch.equal(upper32, upper64)  # the same feasible points
    # rigorous: never above the float64 certificate (a float32 score's error is subtracted), and by at most 2 gamma
    assert bool((lower32 <= lower64 + 1e-13).all())
    assert float((lower64 - lower32).max()) <= 2 * gamma + 1e-13
    assert bool((lower32 <= exact + 1e-10).all()) and bool((upper32 >= exact - 1e-10).all())


def _native_bfloat16() -> bool:
    """Whether GNC2's screening may use bfloat16 products here (oneDNN's kernels: float32 sums, the bound holds)."""
    from kdcollapse.geometry import _distances

    return _distances._screen_dtype(torch.device("cpu")) == torch.bfloat16


needs_native_bfloat16 = pytest.mark.skipif(not _native_bfloat16(), reason="no native bfloat16 products on this CPU "
                                           "(AVX2 only): the library screens in float32 there")


@pytest.mark.parametrize("block_size", [None, 4])  # 4: more than one exact block is near, so tightening runs
@pytest.mark.parametrize("screen_dtype", [torch.float32, pytest.param(torch.bfloat16, marks=needs_native_bfloat16)])
@pytest.mark.parametrize("num_classes, dim, offset", [(300, 8, 0.0), (400, 48, 0.5), (60, 200, 0.3)])
def test_screened_bounds_hold_for_both_product_precisions(num_classes, dim, offset, screen_dtype, block_size,
                                                          monkeypatch):
    from kdcollapse.geometry import _distances, min_one_vs_rest_distance, one_vs_rest_distances

    g = torch.Generator().manual_seed(num_classes + dim)
    weight = torch.randn(num_classes, dim, generator=g, dtype=torch.float64) + offset
    every = one_vs_rest_distances(weight)
    tightened = []
    tighten = _distances._tighten
    monkeypatch.setattr(_distances, "_tighten", lambda *a: tightened.append(1) or tighten(*a))
    screened = min_one_vs_rest_distance(weight, candidates=16, screen_candidates=24, screen_dtype=screen_dtype,
                                        block_size=block_size)
    near = int((screened.lower <= screened.upper.min() + 1e-10).sum())
    assert bool(tightened) == (block_size == 4) or near <= 4  # tightening only when one exact block is not enough
    # rigorous brackets for every class, the exact minimum, its class among the solved ones
    assert bool((screened.lower <= every + 1e-12).all()) and bool((screened.upper >= every - 1e-12).all())
    assert float(screened.value) == pytest.approx(float(every.min()), abs=1e-10) and float(screened.gap) <= 1e-10
    assert int(every.argmin()) in screened.solved.tolist()
    # branch and bound: each class either solved or excluded by its bounds
    skipped = torch.ones(num_classes, dtype=torch.bool)
    skipped[screened.solved] = False
    assert bool((screened.lower[skipped] > screened.value).all())


@needs_native_bfloat16
@pytest.mark.parametrize("dim", [5, 64, 576, 2048])
def test_bfloat16_product_error_bound_holds_against_float64(dim):
    """The bound of _product_error (bfloat16 rows and direction, float32 sums, bfloat16 result) against the
    float64 product of the exact unit rows with the exact bfloat16 direction."""
    from kdcollapse.geometry import _distances, _rounding

    g = torch.Generator().manual_seed(dim)
    weight = torch.randn(3000, dim, generator=g, dtype=torch.float64) + 0.4
    rows = _distances._UnitRows(weight)
    y = (torch.randn(40, dim, generator=g) * torch.logspace(-3, 1, 40)[:, None]).bfloat16()
    computed = (y @ rows.W32.bfloat16().T).double()
    exact = y.double() @ _distances.unit_rows(weight).T
    bound = _rounding._product_error(torch.bfloat16, dim) * y.double().norm(dim=1, keepdim=True) + dim * 2.0**-120
    ratio = (computed - exact).abs() / bound
    assert float(ratio.max()) <= 1.0
    # the test has teeth: float32's bound, without the bfloat16 roundings, is exceeded
    float32 = _rounding._product_error(torch.float32, dim) * y.double().norm(dim=1, keepdim=True)
    assert bool(((computed - exact).abs() > float32).any())


def test_feasible_norm_bounds_the_float64_point_of_the_float32_weights():
    from kdcollapse.geometry import _distances, _screening, _solver

    g = torch.Generator().manual_seed(3)
    weight = torch.randn(500, 96, generator=g, dtype=torch.float64) + 0.5
    rows, k = _distances._UnitRows(weight), torch.arange(0, 500, 7)
    cand = _solver._candidates(rows.W32, k, 40)
    lam, y = _solver._screen_weights(rows.W32, k, cand)
    bound = _screening._feasible_norm(lam, y)
    unit = _distances.unit_rows(weight)
    weights = lam.double() / lam.double().sum(1, keepdim=True)  # the feasible point the weights define, in float64
    point = torch.einsum("bm,bmd->bd", weights, unit[cand] - unit[k][:, None, :])
    assert bool((bound >= point.norm(dim=1)).all())
    assert float((bound - point.norm(dim=1)).max()) < 1e-4  # and close to it


@needs_native_bfloat16
def test_screening_keeps_the_near_classes_state_and_certifies_to_float32s_error(monkeypatch):
    """With bfloat16 products the screening keeps the state (candidates, weights, y) of every class whose lower
    bound does not exclude it; its certificate is as tight as a float32 product's (the window of classes its
    bfloat16 scores cannot exclude, scored again in float32), far tighter than the bfloat16 scores alone give;
    tightening keeps every bound a bracket of the exact distance."""
    from kdcollapse.geometry import _distances, _rounding, _screening, one_vs_rest_distances

    g = torch.Generator().manual_seed(11)
    weight = torch.randn(600, 32, generator=g, dtype=torch.float64) + 0.5
    rows, tol = _distances._UnitRows(weight), 1e-10
    exact = one_vs_rest_distances(weight)
    low = rows.W32.bfloat16()
    monkeypatch.setattr(_screening, "_BLOCK_BYTES", 4 * 600 * 100)  # wide blocks of 100 classes
    upper, lower, kept = _screening._screen_all(rows, 24, low, tol)
    parts, smallest = [], math.inf
    for k in torch.arange(600).split(100):
        parts.append(_screening._screen_bounds(rows, k, 24, low, smallest, tol))
        smallest = min(smallest, float(parts[-1][0].min()))
    monkeypatch.undo()
    upper16, lower16, cand, lam, Y = (torch.cat(column) for column in zip(*parts))
    assert torch.equal(upper, upper16) and torch.equal(lower, lower16)
    near = (lower16 <= upper16.min() + tol).nonzero().flatten()
    assert 0 < len(near) < 600 and set(near.tolist()) <= set(kept.classes.tolist())
    assert torch.equal(kept.directions, Y[kept.classes]) and torch.equal(kept.candidates, cand[kept.classes])
    float32 = torch.minimum(_screening._lower_bounds(rows, near, Y[near], rows.W32), upper16[near])
    floor = 2 * _rounding._product_error(torch.float32, 32)  # both within it of the true certificate
    assert float((float32 - lower16[near]).abs().max()) <= floor
    y = Y[near].bfloat16().double()  # the bfloat16 scores alone, their error subtracted: far looser
    scores = y @ low.double().T
    scores[torch.arange(len(near)), near] = math.inf
    alone = ((scores.min(1).values - _rounding._product_error(torch.bfloat16, 32) * y.norm(dim=1)
              - (y * rows.gather(near)).sum(1)) / y.norm(dim=1)).clamp_min(0)
    assert float((lower16[near] - alone).median()) > 100 * floor
    _distances._tighten(rows, upper, lower, kept, 24, tol, low)
    assert bool((lower >= lower16).all()) and bool((upper <= upper16).all())
    assert bool((lower <= exact + 1e-12).all()) and bool((upper >= exact - 1e-12).all())


@needs_native_bfloat16
@pytest.mark.parametrize("window", [4096, 8])
def test_window_minimum_is_a_certified_lower_bound_at_float32s_error(monkeypatch, window):
    """The bfloat16 certificate's minimum (``_window_minimum``) against the float64 minimum of <w_j, y> over
    j != k, for directions of norms 1e-3 to 10, a zero direction, directions whose smallest 300 scores lie
    within the bfloat16 error of each other while their bfloat16 roundings differ (rows v + p_j with p_j
    orthogonal to y, the first row 1e-4 lower along y: the bfloat16 order of the window is scrambled, and a
    window of the first 64 classes misses the minimum), and with a window too small for most rows
    (``_WINDOW`` = 8: those rows take the full float32 product)."""
    from kdcollapse.geometry import _distances, _rounding, _screening

    monkeypatch.setattr(_screening, "_WINDOW", window)
    monkeypatch.setattr(_screening, "_WINDOW_SHARE", 1)  # windows up to K: the cluster's window is gathered
    g = torch.Generator().manual_seed(13)
    direction = torch.tensor([1.0, -1.0], dtype=torch.float64).repeat(24) / 48**0.5
    spread = torch.randn(300, 48, generator=g, dtype=torch.float64)
    spread -= torch.outer(spread @ direction, direction)  # orthogonal to the direction
    weight = torch.cat([torch.ones(48, dtype=torch.float64) / 48**0.5 + 0.05 * spread
                        - 1e-4 * torch.eye(300, 1, dtype=torch.float64) * direction,
                        torch.randn(2700, 48, generator=g, dtype=torch.float64) + 10 * direction])
    rows = _distances._UnitRows(weight)
    k = torch.randint(300, 3000, (41,), generator=g)
    Y = torch.randn(41, 48, generator=g) * torch.logspace(-3, 1, 41)[:, None]
    Y[7] = 0
    Y[30:] = direction.float() * torch.logspace(-1, 1, 11)[:, None]
    exact = (Y.double() @ _distances.unit_rows(weight).T)
    exact[torch.arange(41), k] = math.inf
    exact = exact.min(1).values
    lowest = _screening._window_minimum(rows, k, Y, _screening._products(Y, k, rows.W32.bfloat16()))
    floor = 2 * (_rounding._product_error(torch.float32, 48) * Y.double().norm(dim=1) + 48 * 2.0**-120)
    assert bool((lowest <= exact).all())
    assert bool((exact - lowest <= floor).all())


def test_tightening_narrows_the_screened_bounds_and_keeps_them_rigorous():
    """Float32 column generation (``_tighten``) on the classes the screening leaves near the minimum: still a
    bracket of every exact distance, a much narrower one, and few classes left that can attain the minimum."""
    from kdcollapse.geometry import _distances, _screening, one_vs_rest_distances

    g = torch.Generator().manual_seed(12)
    weight = torch.randn(800, 40, generator=g, dtype=torch.float64) + 0.5
    rows, tol = _distances._UnitRows(weight), 1e-10
    exact = one_vs_rest_distances(weight)
    low = rows.W32.to(_distances._screen_dtype(rows.device))
    upper, lower, kept = _screening._screen_all(rows, 24, low, tol)
    near = (lower <= upper.min() + tol).nonzero().flatten()
    before = (exact - lower)[near].median(), (upper - exact)[near].median()
    _distances._tighten(rows, upper, lower, kept, 24, tol, low)
    assert bool((lower <= exact + 1e-12).all()) and bool((upper >= exact - 1e-12).all())
    left = (lower <= upper.min() + tol).nonzero().flatten()  # each went through every round: tight bounds
    assert 1 <= len(left) < len(near) / 4, (len(left), len(near))
    assert float((exact - lower)[left].max()) < float(before[0]) / 100
    assert float((upper - exact)[left].max()) < float(before[1]) / 10


def test_duplicate_rows_give_zero_distances_with_bounded_work(monkeypatch):
    """Classes with a duplicate row have distance 0 (y = 0): every score ties with the minimum, and the exact
    certificate's scores fall back to float64 chunks instead of gathering ever more of the K rows per class (a
    real W, SmolLM2-135M's output embedding, has such rows)."""
    from kdcollapse.geometry import _distances, _solver, _unit_rows, min_one_vs_rest_distance, one_vs_rest_distances

    g = torch.Generator().manual_seed(13)
    weight = torch.randn(400, 16, generator=g, dtype=torch.float64) + 0.3
    weight[5] = weight[17]
    weight[300] = 2.5 * weight[17]  # the same direction: rows are normalised
    distances = one_vs_rest_distances(weight, candidates=8)
    assert float(distances[[5, 17, 300]].max()) < 1e-15 and float(distances.min()) < 1e-15
    screened = min_one_vs_rest_distance(weight, candidates=8)
    assert float(screened.value) < 1e-15 and float(screened.gap) < 1e-15
    # the degenerate direction y = 0 directly: exact scores, no gather of more than 32 rows per class
    rows, k = _distances._UnitRows(weight), torch.arange(10)
    monkeypatch.setattr(_unit_rows, "_CHUNK_ENTRIES", 16 * 40)  # chunks of 40 rows: at most 32 gathered per class
    monkeypatch.setattr(_solver, "_CHUNK_ENTRIES", 16 * 40)  # chunks of 40 rows: at most 32 gathered per class
    gathered = []
    gather = _distances._UnitRows.gather
    monkeypatch.setattr(_distances._UnitRows, "gather", lambda self, index: gathered.append(
        index.shape[-1] if isinstance(index, torch.Tensor) and index.ndim == 2 else 0) or gather(self, index))
    scores = _solver._scores(rows, k, torch.zeros(10, 16, dtype=torch.float64))
    assert max(gathered, default=0) <= max(32, _solver._CHUNK_ENTRIES // (10 * 16))
    expected = torch.zeros(10, 400, dtype=torch.float64)
    expected[torch.arange(10), k] = math.inf
    assert torch.equal(scores, expected)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_gnc2_solvers_leave_the_classifier_unchanged(dtype):
    from kdcollapse.geometry import min_one_vs_rest_distance, nearest_points

    weight = (torch.randn(50, 6, generator=torch.Generator().manual_seed(9), dtype=torch.float64) + 0.2).to(dtype)
    before = weight.clone()
    min_one_vs_rest_distance(weight, candidates=8)
    nearest_points(weight, candidates=8)
    assert torch.equal(weight, before)


def test_screen_dtype_rule_and_bad_value():
    from kdcollapse.errors import KdcollapseError
    from kdcollapse.geometry import _distances, min_one_vs_rest_distance

    native = torch.backends.mkldnn.is_available() and torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert _distances._screen_dtype(torch.device("cpu")) == (torch.bfloat16 if native else torch.float32)
    assert _distances._screen_dtype(torch.device("meta")) == torch.float32
    message = "screen_dtype must be torch.float32 or torch.bfloat16, got torch.float16"
    with pytest.raises(KdcollapseError, match=message):
        min_one_vs_rest_distance(torch.randn(10, 3), screen_dtype=torch.float16)


def test_bfloat16_screening_is_refused_where_not_native(monkeypatch):
    from kdcollapse.errors import KdcollapseError
    from kdcollapse.geometry import _distances, min_one_vs_rest_distance

    monkeypatch.setattr(_distances, "_screen_dtype", lambda device: torch.float32)  # as on an AVX2-only CPU
    with pytest.raises(KdcollapseError, match="needs native bfloat16 products summed in float32"):
        min_one_vs_rest_distance(torch.randn(10, 3), screen_dtype=torch.bfloat16)
    weight = torch.randn(200, 6, generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    assert float(min_one_vs_rest_distance(weight).value) == pytest.approx(
        float(min_one_vs_rest_distance(weight, screen_dtype=torch.float32).value), abs=1e-12)


def test_float32_screening_is_used_only_under_ieee_float32_products():
    from kdcollapse.geometry import _rounding

    cpu = torch.device("cpu")
    assert _rounding._ieee_float32_matmul(cpu) and not _rounding._ieee_float32_matmul(torch.device("meta"))
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    settings = [getattr(matmul, "fp32_precision", None), getattr(torch.backends.cuda.matmul, "fp32_precision", None)]
    try:
        for precision in ("high", "medium"):  # TF32 or bfloat16 inner products allowed: float64 scores instead
            torch.set_float32_matmul_precision(precision)
            assert not _rounding._ieee_float32_matmul(cpu)
        torch.set_float32_matmul_precision("highest")
        assert _rounding._ieee_float32_matmul(cpu)
        if settings[0] is not None:  # torch >= 2.9: the CPU backend's own setting
            matmul.fp32_precision = "bf16"
            assert not _rounding._ieee_float32_matmul(cpu)
    finally:
        torch.set_float32_matmul_precision("highest")
        if settings[0] is not None:
            matmul.fp32_precision, torch.backends.cuda.matmul.fp32_precision = settings
    assert _rounding._ieee_float32_matmul(cpu)


# ---------------------------------------------------------------------------------------------------
# Memory: GNC2's solver and NC4 make no K x d float64 copy of a float32 input, and answer as the dense code
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_rows", [None, 1, 7])
def test_gnc2_solver_keeps_float32_rows_and_equals_the_dense_solver(monkeypatch, chunk_rows):
    from kdcollapse.geometry import _distances, _solver, _unit_rows, min_one_vs_rest_distance, one_vs_rest_distances

    g = torch.Generator().manual_seed(8)
    weight = torch.randn(120, 12, generator=g) + 0.3  # float32, as under float32 accumulation
    dense = one_vs_rest_distances(weight.double())  # the same float32 values, widened as a whole
    if chunk_rows is not None:
        monkeypatch.setattr(_unit_rows, "_CHUNK_ENTRIES", 12 * chunk_rows)  # chunks of 1 or 7 rows
        monkeypatch.setattr(_solver, "_CHUNK_ENTRIES", 12 * chunk_rows)  # chunks of 1 or 7 rows
    rows = _distances._UnitRows(weight)
    # W itself (same storage, float32) and float32 unit rows: no float64 (K, d) copy is kept
    assert rows.W.data_ptr() == weight.data_ptr() and rows.W.dtype == rows.W32.dtype == torch.float32
    assert torch.equal(rows.gather(torch.arange(120)), _distances.unit_rows(weight.double()))
    y = torch.randn(5, 12, generator=g, dtype=torch.float64)
    assert torch.allclose(rows.scores(y), y @ _distances.unit_rows(weight.double()).T, rtol=0, atol=1e-14)
    screened = min_one_vs_rest_distance(weight, candidates=16)
    assert float(screened.value) == pytest.approx(float(dense.min()), abs=1e-10)
    assert float(screened.gap) <= 1e-10
    assert torch.allclose(one_vs_rest_distances(weight), dense, rtol=0, atol=1e-10)
    widened = weight.double()
    assert _distances._UnitRows(widened).W.data_ptr() == widened.data_ptr()  # a float64 W is not copied either


def test_collapse_metrics_gnc2_does_not_depend_on_the_weight_dtype():
    h, y = gaussian_classes([30] * 40, 8, seed=21)
    weight = torch.randn(40, 8, generator=torch.Generator().manual_seed(2)).double()
    stats = FeatureStatistics(40, 8)
    stats.update(h, y)
    from kdcollapse.geometry import one_vs_rest_distances

    assert float(collapse_metrics(stats, weight)["gnc2"]) == pytest.approx(
        float(one_vs_rest_distances(weight).min()), abs=1e-10)


def test_nc4_keeps_float32_class_means_in_float32_and_agrees_with_brute_force(monkeypatch):
    import kdcollapse.metrics._ncc as ncc

    g = torch.Generator().manual_seed(4)
    means = 3 * torch.randn(60, 6, generator=g) + 100.0  # far from the origin: centring matters
    labels = torch.randint(0, 60, (500,), generator=g)
    features = means[labels] + torch.randn(500, 6, generator=g)
    brute = torch.cdist(features.double(), means.double()).argmin(1)
    metric = NearestClassMeanAccuracy(means)
    assert metric.centred_means.dtype == torch.float32  # the one K x d copy, in the means' dtype
    assert NearestClassMeanAccuracy(means.double()).centred_means.dtype == torch.float64
    monkeypatch.setattr(ncc, "_SCORES", 60 * 9)  # blocks of 9 rows
    metric.update(features, labels)
    assert float(metric.compute()["ncc_accuracy"]) == pytest.approx(float((brute == labels).double().mean()))
    assert torch.equal(nearest_class_mean(features, means), brute)
    assert torch.equal(nearest_class_mean(features, means.double()), brute)


def test_statistics_keep_no_second_k_by_d_copy_for_reset():
    stats = FeatureStatistics(50, 8, accumulate="float32")
    for name in ("class_sums", "unit_class_sums"):
        default = stats._defaults[name]
        assert default.shape == (50, 8) and default.dtype == torch.float32
        assert default.untyped_storage().nbytes() == 4  # one zero, not 50 x 8
    h, y = gaussian_classes([6] * 50, 8, seed=3)
    stats.update(h, y)
    before = collapse_metrics(stats)
    stats.reset()  # back to full zero states, which update can add into
    assert stats.class_sums.shape == (50, 8) and stats.class_sums.is_contiguous()
    assert not stats.class_sums.any() and int(stats.class_counts.sum()) == 0
    stats.update(h, y)
    again = collapse_metrics(stats)
    assert all(torch.equal(before[k], again[k]) or bool(before[k].isnan().all() & again[k].isnan().all())
               for k in before)
    moved = stats.to(torch.device("cpu"))  # _apply keeps the defaults lean
    assert moved._defaults["class_sums"].untyped_storage().nbytes() == 4
    assert moved._defaults["class_sums"].shape == (50, 8)


def test_constructing_the_statistics_allocates_the_two_k_by_d_sums_once(monkeypatch):
    """Not the four K x d tensors that a plain ``add_state`` (the state and a deep copy of it as the default
    for ``reset()``) would make: no K x d tensor is deep-copied (storage copies bypass LiveBytes)."""
    import copy

    from kdcollapse.metrics import _metric

    copied = []
    monkeypatch.setattr(_metric, "deepcopy",
                        lambda value, *memo: copied.append(getattr(value, "shape", None)) or copy.deepcopy(value, *memo))
    with LiveBytes() as counter:
        stats = FeatureStatistics(500, 64)
    assert (500, 64) not in copied and (64, 64) in copied  # the d x d moments' defaults are copied as before
    sums = 2 * 500 * 64 * 8
    small = 2 * 64 * 64 * 8 + 4 * 500 * 8 + 4 * 64 * 8  # moments, counts and squares, shifts
    assert sums <= counter.peak <= sums + small
    assert stats.class_sums.shape == stats.unit_class_sums.shape == (500, 64) and not stats.class_sums.any()


class LiveBytes(TorchDispatchMode):
    """Counts the bytes of the tensor storages that torch allocates while it is active and that are still
    referenced, and their peak: every op's outputs pass through ``__torch_dispatch__``; a storage is counted once
    (by its data pointer) from its first output until the last tensor on it is freed (views share it). Views of
    storages allocated before (an op's output on an input's storage) are not allocations."""

    def __init__(self):
        super().__init__()
        self.live, self.refs, self.peak = 0, {}, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        leaves = torch.utils._pytree.tree_leaves
        inputs = {t.untyped_storage().data_ptr() for t in leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for tensor in leaves(out):
            if isinstance(tensor, torch.Tensor) and tensor.untyped_storage().nbytes():
                self._hold(tensor, inputs)
        return out

    def _hold(self, tensor, inputs):
        ptr = tensor.untyped_storage().data_ptr()
        if ptr not in self.refs:
            if ptr in inputs:
                return  # a view or in-place result on a storage allocated before
            size = tensor.untyped_storage().nbytes()
            self.refs[ptr] = [0, size]
            self.live += size
            self.peak = max(self.peak, self.live)
        self.refs[ptr][0] += 1
        weakref.finalize(tensor, self._release, ptr)

    def _release(self, ptr):
        entry = self.refs[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.refs[ptr]


def test_live_bytes_counts_allocations_and_frees():
    with LiveBytes() as counter:
        a = torch.zeros(1000, 100, dtype=torch.float64)  # 800 kB
        view = a[10:20]
        del a
        b = view + 1  # 80 kB: a's storage lives on through the view
        del view
        c = b * 2
        del b
        assert counter.live == 8_000  # c alone
        del c
    assert counter.peak == 800_000 + 8_000 and counter.live == 0  # a and b (a lived on through the view)
    kept = torch.ones(100, dtype=torch.float64)
    with LiveBytes() as counter:
        view = kept[:50]
        view += 1
        doubled = view * 2
    assert counter.peak == counter.live == doubled.untyped_storage().nbytes() == 400  # views of older storages: none


@pytest.mark.parametrize("accumulate", ["float64", "float32"])
def test_metric_phase_holds_no_k_by_d_copy_beyond_the_states_and_w(monkeypatch, accumulate):
    """docs/metrics.md's peak memory bound: every K x d matrix the metric phase derives from the states is formed
    CHUNK_ROWS rows (or one tile) at a time, so beyond O(K) vectors, d x d matrices, chunks and tiles it allocates
    less than a quarter of one K x d copy; the code before this bound made about ten. GNC2's solver (its own
    stated float32 copy) is left out, and each pairwise kernel visits 6 tiles (a tile's memory is fixed)."""
    import kdcollapse.metrics._collapse as collapse
    import kdcollapse.metrics._linalg as linalg
    import kdcollapse.metrics._pairwise as pairwise
    from kdcollapse.geometry import min_one_vs_rest_distance

    num_classes, dim, chunk, tile = 4000, 64, 200, 50
    h, y = gaussian_classes([2] * num_classes, dim, seed=8, offset=5.0)
    stats = FeatureStatistics(num_classes, dim, accumulate=accumulate)
    stats.update(h, y)
    width = 4 if accumulate == "float32" else 8
    weight = torch.randn(num_classes, dim, dtype=stats.class_sums.dtype, generator=torch.Generator().manual_seed(1))
    monkeypatch.setattr(collapse, "min_one_vs_rest_distance", lambda w: min_one_vs_rest_distance(w[:3]))
    monkeypatch.setattr(linalg, "CHUNK_ROWS", chunk)
    every_tile = pairwise._upper_tiles
    monkeypatch.setattr(pairwise, "_upper_tiles", lambda num, size: list(every_tile(num, size))[::500][:6])
    expected = collapse_metrics(stats, weight, tile=tile)
    with LiveBytes() as counter:
        values = collapse_metrics(stats, weight, tile=tile)
    copy = num_classes * dim * width
    small = 40 * num_classes * 8 + 32 * dim**2 * 8 + 8 * chunk * (dim + 2) * 8 + 8 * tile**2 * 8
    assert counter.peak < copy / 4 + small, (counter.peak, copy, small)
    assert all(torch.allclose(v.double(), expected[k].double(), rtol=1e-12, atol=0, equal_nan=True)
               for k, v in values.items())  # the counting changes nothing (up to eigvalsh's rounding)


def test_vocab_benchmark_gnc2_in_full_runs_and_checks_itself_at_small_k():
    """``bench_vocab_collapse.py --gnc2-exact`` (the runs of results/benchmarks/vocab_collapse.md) at a small K,
    its case run in this process (``gnc2_exact``, what ``--one 1500x24 --gnc2-exact 16`` runs): its record
    names the phases and its own check against the exact solver passes."""
    import importlib.util
    from pathlib import Path

    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vocab_collapse.py"
    spec = importlib.util.spec_from_file_location("bench_vocab_collapse", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    record = bench.gnc2_exact(1500, 24, 16)
    assert record["mode"] == "gnc2_exact" and record["K"] == 1500 and record["subset"] == 16
    assert record["subset_below_gnc2"] == 0 and record["subset_outside_screen_bounds"] == 0
    assert record["near_after_refining"] <= record["near_after_screening"] and record["solved_exactly"] >= 1
    assert record["gnc2"] <= record["subset_exact_min"] + 1e-10 and record["gnc2_gap"] <= 1e-10


def test_vocab_benchmark_scales_rhubarbwus_cdnv_and_gives_its_float64_etf_errors():
    """``--rhubarbwu-cdnv-classes N`` (its CDNV on N classes, the time scaled by (K / N)^2) and
    ``--rhubarbwu-float64`` (its ETF errors on the same means in float64) of bench_vocab_collapse.py, the
    options of the K = 32,000 runs of results/benchmarks/vocab_collapse.md. Needs rhubarbwu/neural-collapse
    installed (``pip install --no-deps`` from its repository); skipped without it."""
    import argparse
    import importlib.util
    from pathlib import Path

    pytest.importorskip("neural_collapse")
    script = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_vocab_collapse.py"
    spec = importlib.util.spec_from_file_location("bench_vocab_collapse", script)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    args = argparse.Namespace(rhubarbwu_tokens=0, rhubarbwu_stats_only=False, rhubarbwu_batch=0, max_gib=2.0,
                              rhubarbwu_cdnv_classes=40, rhubarbwu_tile=16, rhubarbwu_float64=True, ncc_tokens=64)
    num, dim = 120, 8
    out = bench.rhubarbwu_case(num, dim, num, torch.randn(num, dim, generator=torch.Generator().manual_seed(3)), args)
    assert out["rw_cdnv_classes"] == 40 and out["rw_cdnv_scale"] == (num / 40) ** 2
    assert out["rw_metrics_s_cpu_extrapolated"] == pytest.approx(
        out["rw_metrics_s_cpu"] + out["rw_cdnv_scale"] * out["rw_cdnv_subset_s_cpu"], rel=1e-12)
    values = out["rw_values"]
    assert "cdnv" not in values and math.isfinite(values["cdnv_first_40"])
    # the float64 ETF error against its definition on the float32 means it computed (Kothapalli's structure error)
    from neural_collapse.accumulate import MeanAccumulator

    acc = MeanAccumulator(num, dim, "cpu")
    for x, y in bench.batches(num, dim, num):
        acc.accumulate(x, y)
    means = acc.compute()[0].double()
    centred = (means - means.mean(0)).numpy()
    gram = centred @ centred.T
    gram = gram / np.linalg.norm(gram) + 1 / num / math.sqrt(num - 1) - np.eye(num) / math.sqrt(num - 1)
    assert values["nc2_etf_error_float64"] == pytest.approx(float(np.linalg.norm(gram)), rel=1e-12)
    assert values["nc2_etf_error"] == pytest.approx(values["nc2_etf_error_float64"], rel=1e-4)  # float32 at small K


def test_the_gnc2_example_of_the_geometry_page_runs():
    """docs/geometry.md's ``min_one_vs_rest_distance`` example (both screening precisions) runs as written."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[1] / "docs" / "geometry.md").read_text()
    blocks = re.findall(r"^```python\n(.*?)^```", page, flags=re.S | re.M)
    blocks = [block for block in blocks if "min_one_vs_rest_distance" in block]
    assert len(blocks) == 1
    namespace: dict = {}
    exec(compile(blocks[0], "docs/geometry.md", "exec"), namespace)  # noqa: S102 - the page's own example
    assert float(namespace["same"].value) == pytest.approx(float(namespace["gnc2"].value), abs=1e-10)
