"""Every measure of rhubarbwu/neural-collapse (the library of Wu & Papyan's "Linguistic Collapse", NeurIPS 2024)
that tests/test_metrics_vocab.py does not already compare: hyperspherical uniformity (its ``kernel_stats`` with
the distance, log and Riesz kernels), UNC3 (``similarities(W, M, m_G).var()``), NC5 (``orthogonality_deviation``)
and NC1 by SVD and by quotient (``covariance_ratio(metric="svd" | "quotient")``).

Each is checked three ways: against a literal transcription of rhubarbwu's functions (below, cited by commit and
file; run in float64 on the same class means), against a slow float64 loop over the definition, and, where the
library is installed (``pip install --no-deps git+https://github.com/rhubarbwu/neural-collapse``), against the
library itself. The kdcollapse values come from the streamed states and the tiled pass (no K x K matrix)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy.sparse.linalg import svds

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import METRICS, FeatureMean, FeatureStatistics, collapse_metrics
from kdcollapse.metrics._pairwise import class_mean_kernels, pair_moments
from test_metrics_vocab import gaussian_classes

RHUBARBWU = "rhubarbwu/neural-collapse@c05a0b80d6bc6e8e2e102f2180f1f33b2c9605fd"



# ---------------------------------------------------------------------------------------------------
# rhubarbwu/neural-collapse at RHUBARBWU, transcribed literally in float64 torch:
# neural_collapse/util.py (normalize, tiling, symm_reduce), neural_collapse/kernels.py (dist_kernel, log_kernel,
# riesz_kernel, kernel_grid, kernel_stats), neural_collapse/measure.py (covariance_ratio, similarities,
# orthogonality_deviation) and accumulate.py (MeanAccumulator.compute(weighted=False): m_G = mean of class means;
# CovarAccumulator: V_intra = sum (x - M[y])(.)^T / (N + eps)).
# ---------------------------------------------------------------------------------------------------


def rw_normalize(x):
    return x / (torch.linalg.norm(x, dim=-1, keepdim=True) + torch.finfo(x.dtype).eps)


def rw_tiling(data, kernel, tile_size=None):
    n = len(data)
    outgrid = torch.zeros((n, n), dtype=data.dtype)
    tile_size = tile_size or n
    n_tiles = (n + tile_size - 1) // tile_size
    for i in range(n_tiles):
        i0, i1 = i * tile_size, min((i + 1) * tile_size, n)
        for j in range(n_tiles):
            j0, j1 = j * tile_size, min((j + 1) * tile_size, n)
            outgrid[i0:i1, j0:j1] = kernel(data[i0:i1], data[j0:j1])
    return outgrid


def rw_symm_reduce(data, reduce=torch.sum):
    n = data.shape[0]
    total = 0
    for i in range((n - 1) // 2):
        upper = data[i][i + 1:]
        lower = data[n - i - 2][n - i - 1:]
        total += reduce(torch.cat((upper, lower)))
    if n % 2 == 0:
        total += reduce(data[n // 2 - 1][n // 2:])
    return total / (n * (n - 1) / 2)


def rw_dist_kernel(data, tile_size=None):
    return rw_tiling(data, lambda a, b: (a.unsqueeze(1) - b).norm(dim=-1), tile_size)


def rw_log_kernel(data, exponent=-1, tile_size=None):
    return rw_tiling(data, lambda a, b: ((a.unsqueeze(1) - b).norm(dim=-1) ** exponent).log(), tile_size)


def rw_riesz_kernel(data, tile_size=None):
    s = data.shape[-1] - 2
    return rw_tiling(data, lambda a, b: math.copysign(1, s) * (a.unsqueeze(1) - b).norm(dim=-1) ** (-s), tile_size)


def rw_kernel_stats(m, m_g=0, kernel=rw_dist_kernel, tile_size=None):
    grid = kernel(rw_normalize(m - m_g), tile_size=tile_size)
    avg = rw_symm_reduce(grid)
    var = rw_symm_reduce(grid, lambda row: torch.sum((row - avg) ** 2))
    return avg.item(), var.item()


def rw_covariance_ratio(v_intra, m, m_g=0, metric="pinv"):
    (k, _), m_centred = m.shape, m - m_g
    v_inter = m_centred.mT @ m_centred / k
    if metric == "pinv":
        return torch.trace(torch.linalg.pinv(v_inter) @ v_intra).item() / k
    if metric == "svd":
        v_intra, v_inter = v_intra.numpy(), v_inter.numpy()
        eig_vecs, eig_vals, _ = svds(v_inter, k=k - 1)
        inv_sb = eig_vecs @ np.diag(eig_vals ** (-1)) @ eig_vecs.T
        return float(np.trace(v_intra @ inv_sb)) / k
    if metric == "quotient":
        return torch.trace(v_intra).item() / torch.trace(v_inter).item()
    raise NotImplementedError


def rw_similarities(w, m, m_g=0, cos=False):
    m_centred = m - m_g
    if cos:
        return torch.nn.functional.cosine_similarity(w, m_centred)
    return (w * m_centred).sum(dim=1)


def rw_orthogonality_deviation(m, m_g_ood=0):
    return torch.mean(torch.abs(rw_similarities(m, m_g_ood, cos=True))).item()


def rw_accumulate(x, y, num):
    eps = torch.finfo(torch.float64).eps
    ns = torch.bincount(y, minlength=num).to(torch.float64)
    means = torch.eye(num, dtype=torch.float64)[y].T @ x / (ns + eps)[:, None]
    diff = x - means[y]
    return means, means.mean(0), diff.T @ diff / (ns.sum() + eps)


def rhubarbwu_measures(x, y, num, w, ood_mean, tile=None):
    means, m_g, v_intra = rw_accumulate(x, y, num)
    out = {"nc1": rw_covariance_ratio(v_intra, means, m_g),
           "squared_distance": rw_covariance_ratio(v_intra, means, m_g, "quotient"),
           "unc3": rw_similarities(w, means, m_g).var().item(),
           "unc3_cosine": rw_similarities(w, means, m_g, cos=True).var().item(),
           "nc5_ood_deviation": rw_orthogonality_deviation(means, ood_mean)}
    if num - 1 < x.shape[1]:  # scipy's svds needs k = K - 1 < d
        out["nc1_svd"] = rw_covariance_ratio(v_intra, means, m_g, "svd")
    for name, kernel in (("dist", rw_dist_kernel), ("log", rw_log_kernel), ("riesz", rw_riesz_kernel)):
        out[f"nc2g_{name}_mean"], out[f"nc2g_{name}_var"] = rw_kernel_stats(means, m_g, kernel, tile)
    return out


# ---------------------------------------------------------------------------------------------------
# The definitions, as slow float64 loops over class pairs
# ---------------------------------------------------------------------------------------------------


def definitions(x, y, num, w, ood_mean):
    x, w, ood = x.numpy(), w.numpy(), ood_mean.numpy()
    y = y.numpy()
    means = np.stack([x[y == k].mean(0) for k in range(num)])
    centre = means.mean(0)
    units = [(m - centre) / np.linalg.norm(m - centre) for m in means]
    s = x.shape[1] - 2
    values = {"dist": [], "log": [], "riesz": []}
    for a, b in itertools.combinations(range(num), 2):
        r = math.sqrt(sum((p - q) ** 2 for p, q in zip(units[a], units[b])))
        values["dist"].append(r)
        values["log"].append(math.log(1 / r))
        values["riesz"].append(math.copysign(1, s) * r ** (-s))
    out = {}
    for name, v in values.items():
        mean = sum(v) / len(v)
        out[f"nc2g_{name}_mean"], out[f"nc2g_{name}_var"] = mean, sum((t - mean) ** 2 for t in v) / len(v)
    dots = [float(w[k] @ (means[k] - centre)) for k in range(num)]
    cosines = [d / (np.linalg.norm(w[k]) * np.linalg.norm(means[k] - centre)) for k, d in enumerate(dots)]
    out["unc3"], out["unc3_cosine"] = float(np.var(dots, ddof=1)), float(np.var(cosines, ddof=1))
    out["nc5_ood_deviation"] = float(np.mean([abs(m @ ood) / (np.linalg.norm(m) * np.linalg.norm(ood))
                                              for m in means]))
    within = sum(np.outer(x[i] - means[y[i]], x[i] - means[y[i]]) for i in range(len(x))) / len(x)
    between = sum(np.outer(m - centre, m - centre) for m in means) / num
    vals, vecs = np.linalg.eigh(between)
    top = min(num - 1, x.shape[1])
    vals, vecs = vals[-top:], vecs[:, -top:]
    out["nc1_svd"] = float(np.trace(within @ (vecs / vals) @ vecs.T)) / num
    out["squared_distance"] = float(np.trace(within) / np.trace(between))
    return out


CASES = [([40] * 12, 16), ([5, 60, 17, 33, 8, 21, 12, 9], 16), ([6] * 30, 5), ([9] * 7, 6)]


def ours(x, y, num, w, ood_mean, **kwargs):
    stats = FeatureStatistics(num, x.shape[1])
    for part in torch.arange(len(x)).split(37):  # streamed
        stats.update(x[part], y[part])
    return collapse_metrics(stats, w, ood_mean=ood_mean, **kwargs)


@pytest.mark.parametrize("counts, dim", CASES)
@pytest.mark.parametrize("tile", [1, 3, 2048])
def test_equal_to_a_transcription_of_rhubarbwu_and_to_the_definitions(counts, dim, tile):
    num = len(counts)
    x, y = gaussian_classes(counts, dim, seed=num + dim)
    g = torch.Generator().manual_seed(1)
    w, ood_mean = torch.randn(num, dim, generator=g, dtype=torch.float64), torch.randn(dim, generator=g,
                                                                                     dtype=torch.float64)
    mine = ours(x, y, num, w, ood_mean, tile=tile)
    theirs = rhubarbwu_measures(x, y, num, w, ood_mean, tile=3)
    defined = definitions(x, y, num, w, ood_mean)
    assert set(theirs) - {"nc1"} <= set(defined)
    for key, value in theirs.items():
        assert float(mine[key]) == pytest.approx(value, rel=1e-9, abs=1e-12), (RHUBARBWU, key)
    for key, value in defined.items():
        assert float(mine[key]) == pytest.approx(value, rel=1e-10, abs=1e-13), key


def test_rhubarbwu_itself_where_installed():
    nc = pytest.importorskip("neural_collapse", reason="rhubarbwu/neural-collapse is not installed")
    from neural_collapse.kernels import kernel_stats, log_kernel, riesz_kernel
    from neural_collapse.measure import covariance_ratio, orthogonality_deviation, similarities

    num, dim = 12, 16
    x, y = gaussian_classes([30] * num, dim, seed=4)
    w, ood = torch.randn(num, dim, dtype=torch.float64), torch.randn(dim, dtype=torch.float64)
    means, m_g, v_intra = rw_accumulate(x, y, num)
    mine = ours(x, y, num, w, ood)
    theirs = {"nc1_svd": covariance_ratio(v_intra, means, m_g, "svd"),
              "squared_distance": covariance_ratio(v_intra, means, m_g, "quotient"),
              "unc3": similarities(w, means, m_g).var().item(),
              "nc5_ood_deviation": orthogonality_deviation(means, ood)}
    for name, kernel in (("log", log_kernel), ("riesz", riesz_kernel)):
        theirs[f"nc2g_{name}_mean"], theirs[f"nc2g_{name}_var"] = kernel_stats(means, m_g, kernel, tile_size=5)
    # its tiling() fills a float32 grid whatever the inputs' dtype: kernel values to float32's precision
    for key, value in theirs.items():
        tolerance = 1e-5 if key.startswith("nc2g") else 1e-9
        assert float(mine[key]) == pytest.approx(value, rel=tolerance), (nc.__name__, key)


def test_a_simplex_etf_is_the_most_uniform_configuration_and_its_kernel_values_are_known():
    """Paper identity: the K vertices of a unit simplex ETF are equidistant, |u_k - u_k'|^2 = 2 + 2/(K - 1), so
    every kernel's variance is 0 and its mean is the kernel at that distance; perturbing the means raises the
    variances. UNC3 is 0 for W = the means (self-dual)."""
    num = 6
    etf = torch.eye(num, dtype=torch.float64) - 1 / num
    labels = torch.arange(num).repeat(4)
    stats = FeatureStatistics(num, num)
    stats.update(etf[labels], labels)
    m = collapse_metrics(stats, etf)
    r = math.sqrt(2 + 2 / (num - 1))
    assert float(m["nc2g_dist_mean"]) == pytest.approx(r, rel=1e-12)
    assert float(m["nc2g_log_mean"]) == pytest.approx(-math.log(r), rel=1e-12)
    assert float(m["nc2g_riesz_mean"]) == pytest.approx(r ** -(num - 2), rel=1e-12)
    for key in ("nc2g_dist_var", "nc2g_log_var", "nc2g_riesz_var", "unc3", "unc3_cosine"):
        assert abs(float(m[key])) < 1e-24, key
    bent = etf.clone()
    bent[0] += 0.3 * etf[1]
    stats = FeatureStatistics(num, num)
    stats.update(bent[labels], labels)
    worse = collapse_metrics(stats, bent)
    for key in ("nc2g_dist_var", "nc2g_log_var", "nc2g_riesz_var", "unc3"):
        assert float(worse[key]) > 1e-4, key


def test_nc1_by_svd_keeps_the_k_minus_1_largest_eigenvalues_where_the_pseudo_inverse_drops_small_ones():
    """A class mean direction 1e-9 times the others: pinv with rtol = 1e-6 drops it, the truncated SVD keeps it
    (and so does rhubarbwu's svds), so nc1_svd >> nc1; with the default threshold both keep it and agree."""
    num, dim = 4, 6
    means = torch.zeros(num, dim, dtype=torch.float64)
    means[1, 0], means[2, 1], means[3, 2] = 1.0, 1.0, 1e-9
    labels = torch.arange(num).repeat(50)
    x = means[labels] + 1e-3 * torch.randn(len(labels), dim, dtype=torch.float64,
                                           generator=torch.Generator().manual_seed(0))
    stats = FeatureStatistics(num, dim)
    stats.update(x, labels)
    loose, default = collapse_metrics(stats, rtol=1e-6), collapse_metrics(stats)
    assert float(loose["nc1_svd"]) > 1e6 * float(loose["nc1"])
    assert float(default["nc1_svd"]) == pytest.approx(float(default["nc1"]), rel=1e-6)
    for convention in ("papyan", "prior"):  # generic data: Sigma_B's K - 1 eigenvalues are all kept by both
        xs, ys = gaussian_classes([5, 40, 12, 3, 25, 9], 8, seed=2)
        generic = FeatureStatistics(6, 8, convention=convention)
        generic.update(xs, ys)
        m = collapse_metrics(generic)
        assert float(m["nc1_svd"]) == pytest.approx(float(m["nc1"]), rel=1e-10), convention
    class_means, m_g, v_intra = rw_accumulate(x, labels, num)
    assert float(loose["nc1_svd"]) == pytest.approx(rw_covariance_ratio(v_intra, class_means, m_g, "svd"), rel=1e-6)


def test_pair_moments_merge_tiles_exactly_and_a_wrong_merge_fails():
    """The variance over pairs merged tile by tile (Chan's update) equals the variance of all pairs at once, for
    tiles of every size (uneven last tiles included); dropping the between-tile term breaks it."""
    g = torch.Generator().manual_seed(2)
    rows = torch.randn(23, 3, generator=g, dtype=torch.float64) + 5

    def kernel(a, b):
        return ((a[:, None] - b[None]).norm(dim=-1),)

    pairs = torch.tensor([float((rows[i] - rows[j]).norm()) for i, j in itertools.combinations(range(23), 2)],
                         dtype=torch.float64)
    for tile in (1, 2, 5, 7, 22, 23, 100):
        ((mean, var),) = pair_moments(rows, kernel, (True,), tile)
        assert float(mean) == pytest.approx(float(pairs.mean()), rel=1e-13)
        assert float(var) == pytest.approx(float(pairs.var(unbiased=False)), rel=1e-12), tile


@pytest.mark.parametrize("leaf", [1, 3, 16])
def test_halved_diagonal_tiles_cover_every_pair_once(leaf):
    """``_triangle`` (a diagonal tile halved down to ``leaf`` rows) covers each pair i < j of the tile exactly
    once: off-diagonal blocks lie wholly above the diagonal, diagonal blocks are square and count above it."""
    from kdcollapse.metrics._pairwise import _triangle

    for num in (1, 2, 5, 17, 64, 100):
        seen = torch.zeros(num, num, dtype=torch.long)
        for rows, cols, diagonal in _triangle(num, leaf):
            block = seen[rows, cols]
            if diagonal:
                assert rows == cols and rows.stop - rows.start <= leaf, (rows, cols)
                block += torch.ones_like(block).triu(1)
            else:
                assert rows.stop <= cols.start, (rows, cols)
                block += 1
        assert torch.equal(seen, torch.ones(num, num, dtype=torch.long).triu(1)), (num, leaf)


@pytest.mark.parametrize("tile", [7, 32, 4096])
def test_kernels_over_halved_diagonal_tiles_and_reused_buffers_equal_the_definitions(monkeypatch, tile):
    """The pass with diagonal tiles halved to 4-row leaves, uneven tiles (buffers reused at smaller shapes) and
    the moments merged over many blocks equals the float64 pair loops of ``definitions`` and the dense NC2
    equiangularity and CDNV."""
    import kdcollapse.metrics._pairwise as pairwise
    from test_metrics_vocab import dense_cdnv, dense_equiangle

    monkeypatch.setattr(pairwise, "LEAF", 4)
    num, dim = 70, 8
    x, y = gaussian_classes([3] * num, dim, seed=3)
    w, ood = torch.randn(num, dim, dtype=torch.float64), torch.randn(dim, dtype=torch.float64)
    mine = ours(x, y, num, w, ood, tile=tile)
    defined = definitions(x, y, num, w, ood)
    for name in ("dist", "log", "riesz"):
        for key in (f"nc2g_{name}_mean", f"nc2g_{name}_var"):
            assert float(mine[key]) == pytest.approx(defined[key], rel=1e-10, abs=1e-13), (key, tile)
    means = np.stack([x[y == k].numpy().mean(0) for k in range(num)])
    variances = np.array([((x[y == k].numpy() - means[k]) ** 2).sum(1).mean() for k in range(num)])
    assert float(mine["nc2_equiangle"]) == pytest.approx(dense_equiangle(means - means.mean(0)), rel=1e-11)
    assert float(mine["cdnv"]) == pytest.approx(dense_cdnv(means, variances), rel=1e-10)
    # pair_mean over the same halved tiles visits each unordered pair once: the mean of i + j over i < j.
    from kdcollapse.metrics._pairwise import pair_mean

    rows = torch.arange(num, dtype=torch.float64)[:, None]
    expected = np.mean([a + b for a in range(num) for b in range(a + 1, num)])
    assert float(pair_mean(rows, lambda a, b: a + b.mT, tile)) == pytest.approx(expected, rel=1e-14)


@pytest.mark.parametrize("s", [254.0, 3.0, 0.5, 0.0, -2.0])
def test_hyperspherical_kernels_from_one_log_equal_their_definitions(s):
    """dist, log and Riesz-s from log|a - b|^2 (one log, an exp for Riesz) equal sqrt, log(1 / r) and
    sign(s) r^(-s) by ``pow``, with distance 0 (inf, or 1 at s = 0, or -0 for s < 0) included."""
    from kdcollapse.metrics._pairwise import hyperspherical_kernels

    squared = torch.cat([torch.rand(500, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) * 4,
                         torch.tensor([0.0, 1e-300, 2.0, 4.0], dtype=torch.float64)]).reshape(12, 42)
    r = squared.sqrt()
    expected = (r, r.reciprocal().log(), math.copysign(1.0, s) * r.pow(-s))
    for got, want, name in zip(hyperspherical_kernels(squared.clone(), s), expected, ("dist", "log", "riesz")):
        finite = torch.isfinite(want) & (want != 0)
        assert torch.equal(torch.isfinite(got), torch.isfinite(want)), name
        assert torch.equal(got[~finite], want[~finite]), name
        assert torch.allclose(got[finite], want[finite], rtol=1e-13 * (1 + abs(s)), atol=0), (name, s)


def test_tiled_kernels_equal_the_dense_kernels_under_float32_accumulation():
    x, y = gaussian_classes([8] * 40, 12, seed=5)
    w = torch.randn(40, 12, dtype=torch.float64)
    exact = ours(x, y, 40, w, None)
    stats = FeatureStatistics(40, 12, accumulate="float32")
    stats.update(x, y)
    single = collapse_metrics(stats, w, tile=16)
    for key in ("nc2g_dist_mean", "nc2g_dist_var", "nc2g_log_mean", "nc2g_log_var", "nc2g_riesz_mean",
                "nc2g_riesz_var", "unc3", "unc3_cosine", "nc1_svd"):
        assert float(single[key]) == pytest.approx(float(exact[key]), rel=1e-4, abs=1e-7), key


def test_the_kernel_pass_holds_no_k_by_k_matrix():
    """At K = 1,500 with tiles of 100 the largest tensor the pass allocates is a few tiles, never K x K."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Largest(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.largest = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            out = func(*args, **(kwargs or {}))
            for t in torch.utils._pytree.tree_leaves(out):
                if isinstance(t, torch.Tensor):
                    self.largest = max(self.largest, t.numel())
            return out

    num, dim, tile = 1500, 8, 100
    centred = torch.randn(num, dim, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with Largest() as mode:
        class_mean_kernels(centred - centred.mean(0), torch.ones(num, dtype=torch.float64), tile)
    assert mode.largest <= max(tile * tile, num * dim), mode.largest


def test_ood_mean_streams_and_bad_inputs_are_errors():
    g = torch.Generator().manual_seed(3)
    ood = torch.randn(50, 4, generator=g) + 1e6
    mean = FeatureMean(4)
    for part in ood.split(7):
        mean.update(part)
    assert torch.allclose(mean.compute(), ood.double().mean(0), rtol=1e-12)
    x, y = gaussian_classes([5] * 3, 4, seed=0)
    stats = FeatureStatistics(3, 4)
    stats.update(x, y)
    with pytest.raises(KdcollapseError, match=r"ood_mean must be a \(4,\) tensor"):
        collapse_metrics(stats, ood_mean=torch.zeros(5))
    with pytest.raises(KdcollapseError, match="FeatureMean holds no samples"):
        FeatureMean(4).compute()
    assert "nc5_ood_deviation" not in collapse_metrics(stats)
    assert {m.name for m in METRICS if m.needs_ood} == {"nc5_ood_deviation"}
