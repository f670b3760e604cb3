"""Collapse metrics under class imbalance, near perfect collapse and for low-precision features (issue 14 Sec. 1,
issue 16 item 6). The float64 references of the published formulas are ``reference_metrics`` in
tests/test_metrics.py; here: perfect collapse scores 0 for any class sizes, every metric is continuous at
perfect collapse, balanced values are those before the conventions existed, and bf16 / fp16 features give
the float64 answer.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from test_metrics import make_features, reference_metrics, stream
from test_metrics_catalog import names as catalogued

from kdcollapse.metrics import FeatureStatistics, collapse_metrics, ncc_accuracy
from kdcollapse.metrics.functional import collapse_metrics_from_features

CONVENTIONS = ("papyan", "prior")
IMBALANCED = [20, 500, 37, 120, 60, 300, 25, 80, 200, 45]  # K = 10, 20-500 samples per class
# Zero at perfect collapse onto a simplex ETF with W the ETF, for any class sizes.
ZERO_AT_COLLAPSE = (
    "nc1", "fuzziness", "vci", "linear_probe_mse", "squared_distance", "cosine_within", "gnc1",
    "nc2_equinorm", "nc2_equiangle", "nc2_equinorm_w", "nc2_equiangle_w", "nc3", "gnc3",
)


def simplex_etf(num_classes: int, dim: int) -> torch.Tensor:
    """Unit rows of a simplex ETF in R^dim, dim >= K - 1: an orthonormal basis of the vectors summing to 0."""
    centred = torch.eye(num_classes, dtype=torch.float64) - 1 / num_classes
    basis = torch.linalg.svd(centred).Vh[: num_classes - 1]  # (K-1, K), rows orthonormal, orthogonal to 1
    rows = centred @ basis.T  # (K, K-1): the same Gram matrix as ``centred``
    rows = torch.nn.functional.pad(rows, (0, dim - num_classes + 1))
    return rows / rows.norm(dim=1, keepdim=True)


def labels_for(counts: list[int]) -> torch.Tensor:
    labels = torch.repeat_interleave(torch.arange(len(counts)), torch.tensor(counts))
    return labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(0))]


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("dim", [9, 16])  # d = K - 1 and d > K
def test_imbalanced_perfect_collapse_scores_zero(dim, convention):
    num_classes = len(IMBALANCED)
    etf, y = simplex_etf(num_classes, dim), labels_for(IMBALANCED)
    m = collapse_metrics(stream(3.0 * etf[y], y, num_classes, batch=97, convention=convention), 2.0 * etf)
    for name in ZERO_AT_COLLAPSE:
        assert abs(float(m[name])) < 1e-10, name
    assert float(m["class_separation"]) == pytest.approx(1.0, abs=1e-10)
    assert float(m["gnc2"]) == pytest.approx(float(m["gnc2_optimum"]), rel=1e-9)
    assert int(m["rank_between"]) == int(m["rank_between_unit"]) == num_classes - 1


def collapsed_means(num_classes: int, dim: int) -> torch.Tensor:
    """A simplex ETF where it fits (d >= K - 1), else generic unit class means that span R^d."""
    if dim >= num_classes - 1:
        return simplex_etf(num_classes, dim)
    g = torch.Generator().manual_seed(3)
    return torch.nn.functional.normalize(torch.randn(num_classes, dim, generator=g, dtype=torch.float64), dim=1)


@pytest.mark.parametrize("convention", CONVENTIONS)
@pytest.mark.parametrize("counts", [[60] * 10, IMBALANCED], ids=["balanced", "imbalanced"])
@pytest.mark.parametrize("dim", [4, 9, 16])  # d < K - 1, d = K - 1, d > K
def test_every_metric_tends_to_its_value_at_perfect_collapse(dim, counts, convention):
    """Perfect collapse plus eps * noise -> perfect collapse, for every metric, as eps -> 0.

    The uncentred GNC Sigma_B once gained a noise eigenvalue in the direction a simplex ETF leaves empty
    (d >= K), making GNC1 jump from 0 to ~20 at eps = 1e-6. Only the reported ranks of Sigma_T may jump
    (noise makes it full rank): they are diagnostics, not metrics.
    """
    num_classes = len(counts)
    means, y = collapsed_means(num_classes, dim), labels_for(counts)
    weight = 2.0 * means
    noise = torch.randn(len(y), dim, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    at_zero = collapse_metrics_from_features(3.0 * means[y], y, num_classes, weight, convention=convention)
    for eps in (1e-2, 1e-4, 1e-6):
        m = collapse_metrics_from_features(3.0 * means[y] + eps * noise, y, num_classes, weight,
                                           convention=convention)
        for name, value in at_zero.items():
            if name != "rank_total":
                expected = pytest.approx(float(value), abs=10 * eps, nan_ok=True)  # gnc2_optimum: nan if unknown
                assert float(m[name]) == expected, (name, eps)


def test_gnc1_counts_the_class_means_offset_exactly_when_it_is_real():
    """GNC1 is the paper's uncentred Sigma_B = (1/K) sum_k h_k h_k^T = centred + offset offset^T whenever
    the offset (the mean of the unit class means) has a part outside the span of the class-mean
    differences that noise cannot explain; when that part is sampling noise it is left out."""
    num_classes, dim = 5, 8
    etf = simplex_etf(num_classes, dim)
    y = labels_for([40] * num_classes)
    noise = 0.05 * torch.randn(len(y), dim, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    cases = {"noise": etf[y] + noise, "real": etf[y] + noise + 0.3 * torch.eye(dim, dtype=torch.float64)[-1]}
    for name, h in cases.items():
        ours = collapse_metrics_from_features(h, y, num_classes)
        u = torch.nn.functional.normalize(h, dim=1).numpy()
        means = np.stack([u[y.numpy() == k].mean(0) for k in range(num_classes)])
        within = (u - means[y.numpy()]).T @ (u - means[y.numpy()]) / len(u)
        offset = means.mean(0)
        if name == "noise":  # drop the offset's part outside the span of the class-mean differences
            differences = means - offset
            offset = differences.T @ np.linalg.lstsq(differences.T, offset, rcond=None)[0]
        between = (means - means.mean(0)).T @ (means - means.mean(0)) / num_classes + np.outer(offset, offset)
        uncentred = means.T @ means / num_classes  # the paper's, equal to the above with the whole offset
        values, vectors = np.linalg.eigh(between)
        keep = values > 1e-10 * values.max()
        expected = np.trace(within @ (vectors[:, keep] / values[keep]) @ vectors[:, keep].T) / num_classes
        assert float(ours["gnc1"]) == pytest.approx(expected, rel=1e-10), name
        assert int(ours["rank_between_unit"]) == (num_classes - 1 if name == "noise" else num_classes)
        if name == "real":
            np.testing.assert_allclose(between, uncentred, rtol=1e-12, atol=1e-15)


# Today's values (commit 19e03a7, before the conventions) of balanced data: make_features([30] * 5, 8,
# seed=21, offset=2.0) and W = randn(5, 8) with seed 22.
BALANCED_BEFORE = {
    "nc1": 0.15398197492972357, "fuzziness": 0.7699098746486178, "vci": 0.07647305285882333,
    "linear_probe_mse": 0.030589221143529244, "squared_distance": 0.19878827313355713, "rank_between": 4.0,
    "rank_total": 8.0, "vci_rank": 4.0, "cosine_within": 0.1036584868686213,
    "class_separation": 0.8198115844298483, "gnc1": 0.27338352048979286, "rank_between_unit": 5.0,
    "nc2_equinorm": 0.2939742050546844, "nc2_equiangle": 0.3041056149752931,
    "nc2_equinorm_w": 0.32117160851262294, "nc2_equiangle_w": 0.23308773400732416,
    "nc3": 1.7325358945388538, "gnc2": 0.8478079773211102, "gnc2_optimum": 1.25, "gnc3": 0.9924077917958766,
}


@pytest.mark.parametrize("convention", CONVENTIONS)
def test_balanced_values_are_unchanged(convention):
    h, y, _ = make_features([30] * 5, 8, seed=21, offset=2.0)
    w = torch.randn(5, 8, generator=torch.Generator().manual_seed(22), dtype=torch.float64)
    m = collapse_metrics(stream(h, y, 5, convention=convention), w)
    assert set(m) == catalogued(source="collapse_metrics", needs_ood=False) and set(BALANCED_BEFORE) <= set(m)
    for name, value in BALANCED_BEFORE.items():
        assert float(m[name]) == pytest.approx(value, rel=1e-12, abs=1e-15), name


def test_conventions_differ_only_where_documented_on_imbalanced_data():
    counts, dim = [5, 40, 12, 3, 25, 9], 4
    h, y, _ = make_features(counts, dim, seed=1)
    papyan, prior = (collapse_metrics_from_features(h, y, 6, convention=c) for c in CONVENTIONS)
    changed = {name for name in papyan if float(papyan[name]) != pytest.approx(float(prior[name]), rel=1e-12)}
    assert changed and changed == catalogued(prior_weighted=True)  # the catalogue's prior_weighted metrics


# ---------------------------------------------------------------------------------------------------
# Low-precision features (issue 16 item 6)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_features_give_the_float64_answer(dtype):
    """bf16 once gave NC1 0.0078 for 0.018 and VCI 0.342 for 0.017: the pseudo-inverse threshold followed
    the features' dtype (d * eps(bf16) = 0.5) and dropped most of Sigma_T. The states are float64 and so
    is the threshold now: the answer is that of the same rounded values in float64."""
    num_classes, dim = 10, 64
    h, y, _ = make_features([40] * num_classes, dim, seed=5, spread=6.0, offset=3.0)
    rounded = h.to(dtype)
    w = torch.randn(num_classes, dim, generator=torch.Generator().manual_seed(6)).to(dtype)
    low = collapse_metrics(stream(rounded, y, num_classes, batch=64), w)
    exact = collapse_metrics(stream(rounded.double(), y, num_classes, batch=64), w.double())
    assert int(low["rank_total"]) == dim
    for name, value in exact.items():
        assert float(low[name]) == pytest.approx(float(value), rel=1e-2, abs=1e-12), name
    truth = reference_metrics(rounded.double(), y, num_classes)
    for name in ("nc1", "vci", "gnc1", "squared_distance", "cosine_within"):
        assert float(low[name]) == pytest.approx(truth[name], rel=1e-2), name
    means = stream(rounded.double(), y, num_classes).class_means()
    logits = rounded @ w.T
    assert ncc_accuracy(rounded, y, means, logits) == ncc_accuracy(rounded.double(), y, means, logits.double())


def test_states_stay_float64_whatever_the_dtype_requests():
    stats = FeatureStatistics(3, 4)
    stats.set_dtype(torch.bfloat16)
    stats.half().to(torch.float16)
    stats.update(torch.randn(6, 4, dtype=torch.bfloat16), torch.tensor([0, 1, 2, 0, 1, 2]))
    for name in ("shift", "class_sums", "class_square_sums", "moment", "unit_shift", "unit_class_sums", "unit_moment"):
        assert getattr(stats, name).dtype == torch.float64, name
