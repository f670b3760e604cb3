"""Teacher-student geometry (``kdcollapse.metrics.geometry_alignment``, ``PairedFeatures``): constructed pairs with
known answers (a rotated, scaled copy: alignment 1; independent features: unbiased CKA ~ 0), and every number against
a dense float64 reference (the N x N kernel matrices of CKA, scipy's orthogonal Procrustes, K x K Grams)."""

import math

import numpy as np
import pytest
import torch
from scipy.linalg import orthogonal_procrustes

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import FeatureStatistics, PairedFeatures, geometry_alignment


def classes(num, dim, per_class, seed, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    means = spread * torch.randn(num, dim, generator=g, dtype=torch.float64)
    labels = torch.arange(num).repeat(per_class)
    return means[labels] + torch.randn(len(labels), dim, generator=g, dtype=torch.float64), labels


def orthonormal(rows, cols, seed):
    q, _ = torch.linalg.qr(torch.randn(max(rows, cols), max(rows, cols), dtype=torch.float64,
                                       generator=torch.Generator().manual_seed(seed)))
    return q[:rows, :cols]


def measure(xs, xt, labels, num, ws=None, wt=None, batch=23):
    stats = [FeatureStatistics(num, x.shape[1]) for x in (xs, xt)]
    paired = PairedFeatures(xs.shape[1], xt.shape[1])
    for part in torch.arange(len(labels)).split(batch):
        stats[0].update(xs[part], labels[part])
        stats[1].update(xt[part], labels[part])
        paired.update(xs[part], xt[part])
    return geometry_alignment(*stats, ws, wt, paired)


def dense_cka(x, y):
    x, y = x - x.mean(0), y - y.mean(0)
    return float(np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


def hsic_unbiased(k, l):  # Song et al. 2012, eq. 5, on the N x N kernel matrices
    n = len(k)
    k, l = k.copy(), l.copy()
    np.fill_diagonal(k, 0)
    np.fill_diagonal(l, 0)
    one = np.ones(n)
    return (np.trace(k @ l) + (one @ k @ one) * (one @ l @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * one @ k @ l @ one) / (n * (n - 3))


def dense_cka_unbiased(x, y):
    k, l = x @ x.T, y @ y.T
    return float(hsic_unbiased(k, l) / math.sqrt(hsic_unbiased(k, k) * hsic_unbiased(l, l)))


@pytest.mark.parametrize("teacher_dim", [6, 9])
def test_a_rotated_scaled_shifted_copy_is_aligned_exactly(teacher_dim):
    xs, y = classes(5, 6, 12, seed=0)
    q = orthonormal(6, teacher_dim, seed=1)  # orthonormal rows: an isometry into R^teacher_dim
    xt = 2.5 * xs @ q + 7.0
    ws = torch.randn(5, 6, dtype=torch.float64)
    m = measure(xs, xt, y, 5, ws, 0.3 * ws @ q)
    for key in ("procrustes_alignment", "simplex_similarity", "feature_cka", "feature_cka_unbiased",
                "classifier_procrustes_alignment", "classifier_similarity"):
        assert float(m[key]) == pytest.approx(1.0, abs=1e-10), key
    assert float(m["simplex_angle"]) == pytest.approx(0.0, abs=1e-4)
    assert float(m["procrustes_residual"]) == pytest.approx((1 - 2.5) ** 2 / 2.5**2, abs=1e-10)  # scale counts
    unscaled = measure(xs, xs @ q - 3.0, y, 5)
    assert float(unscaled["procrustes_residual"]) == pytest.approx(0.0, abs=1e-10)


def test_independent_features_have_unbiased_cka_near_zero_and_the_biased_one_does_not():
    g = torch.Generator().manual_seed(4)
    n = 4000
    xs, xt = torch.randn(n, 16, generator=g, dtype=torch.float64), torch.randn(n, 12, generator=g, dtype=torch.float64)
    y = torch.arange(n) % 4
    m = measure(xs, xt, y, 4, batch=500)
    assert abs(float(m["feature_cka_unbiased"])) < 0.01
    assert float(m["feature_cka"]) > 2 * abs(float(m["feature_cka_unbiased"]))  # HSIC_0's bias, about d_s d_t / n
    assert float(m["feature_cka"]) == pytest.approx(dense_cka(xs.numpy(), xt.numpy()), rel=1e-10)


def test_every_number_equals_its_dense_reference():
    xs, y = classes(7, 5, 9, seed=2)
    xt, _ = classes(7, 8, 9, seed=3)
    xt = xt + 0.5 * torch.cat([xs, xs[:, :3]], 1)  # related, not a copy
    ws, wt = torch.randn(7, 5, dtype=torch.float64), torch.randn(7, 8, dtype=torch.float64)
    m = measure(xs + 1e4, xt - 1e4, y, 7, ws, wt)  # far from the origin: the sums are taken about a shift
    a, b = xs.numpy(), xt.numpy()
    assert float(m["feature_cka"]) == pytest.approx(dense_cka(a, b), rel=1e-9)
    assert float(m["feature_cka_unbiased"]) == pytest.approx(dense_cka_unbiased(a, b), rel=1e-8)
    ms = np.stack([a[y.numpy() == k].mean(0) for k in range(7)])
    mt = np.stack([b[y.numpy() == k].mean(0) for k in range(7)])
    ms, mt = ms - ms.mean(0), mt - mt.mean(0)
    padded = np.concatenate([ms, np.zeros((7, 3))], 1)  # equal widths for scipy: the same optimum
    rotation, _ = orthogonal_procrustes(padded, mt)
    residual = np.linalg.norm(padded @ rotation - mt) ** 2 / np.linalg.norm(mt) ** 2
    assert float(m["procrustes_residual"]) == pytest.approx(residual, rel=1e-9)
    scale = np.trace((padded @ rotation).T @ mt) / np.linalg.norm(padded) ** 2
    scaled = np.linalg.norm(scale * padded @ rotation - mt) ** 2 / np.linalg.norm(mt) ** 2
    assert 1 - float(m["procrustes_alignment"]) ** 2 == pytest.approx(scaled, rel=1e-9)
    gs, gt = ms @ ms.T, mt @ mt.T
    assert float(m["simplex_similarity"]) == pytest.approx(np.sum(gs * gt) / np.linalg.norm(gs) / np.linalg.norm(gt),
                                                           rel=1e-10)
    assert float(m["simplex_angle"]) == pytest.approx(math.degrees(math.acos(float(m["simplex_similarity"]))))
    vs, vt = ws.numpy() @ ws.numpy().T, wt.numpy() @ wt.numpy().T
    assert float(m["classifier_similarity"]) == pytest.approx(np.sum(vs * vt) / np.linalg.norm(vs) / np.linalg.norm(vt),
                                                              rel=1e-10)


def test_bad_pairs_are_errors():
    stats = [FeatureStatistics(3, 2), FeatureStatistics(4, 2)]
    with pytest.raises(KdcollapseError, match="3 classes, the teacher 4"):
        geometry_alignment(*stats)
    with pytest.raises(KdcollapseError, match="same B"):
        PairedFeatures(2, 3).update(torch.zeros(4, 2), torch.zeros(5, 3))
    few = PairedFeatures(2, 2)
    few.update(torch.randn(3, 2), torch.randn(3, 2))
    with pytest.raises(KdcollapseError, match="at least 4"):
        few.compute()
