"""Unconstrained features model (GNC eq. 2 and B.1) and its GNC1-3 history."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kdcollapse.errors import KdcollapseError
from kdcollapse.experiments.ufm import train_ufm
from kdcollapse.geometry import one_vs_rest_distances, softmax_code_optimum
from kdcollapse.experiments.ufm import _log_mean_cross_entropy, temperature_continuation
from kdcollapse.metrics.functional import collapse_metrics_from_features


def test_history_reports_gnc_metrics_of_kdcollapse_metrics():
    # One implementation: the UFM logs what kdcollapse.metrics measures, and that is Section 2.2's definition.
    result = train_ufm(5, 3, 7, temperature=0.5, steps=3, log_every=3, seed=0)
    K, labels = 5, result.labels
    expected = collapse_metrics_from_features(result.H, labels, K, result.W)
    for name in ("gnc1", "gnc2", "gnc3"):
        assert result.final[name] == pytest.approx(expected[name].item(), rel=1e-12, abs=1e-15)

    h, w = result.H.numpy(), result.W.numpy()
    h, w = h / np.linalg.norm(h, axis=1, keepdims=True), w / np.linalg.norm(w, axis=1, keepdims=True)
    means = np.stack([h[labels.numpy() == k].mean(0) for k in range(K)])
    sigma_w = sum(np.outer(x - means[y], x - means[y]) for x, y in zip(h, labels.numpy())) / len(h)
    sigma_b = sum(np.outer(m, m) for m in means) / K  # uncentred, as written in GNC Section 2.2
    assert result.final["gnc1"] == pytest.approx(np.trace(sigma_w @ np.linalg.pinv(sigma_b)) / K, rel=1e-8)
    assert result.final["gnc3"] == pytest.approx(np.mean(1 - (w * means).sum(1)), rel=1e-10)
    assert result.final["gnc2"] == pytest.approx(one_vs_rest_distances(result.W).min().item(), abs=1e-12)


def test_log_mean_cross_entropy_is_exact_and_does_not_underflow():
    g = torch.Generator().manual_seed(1)
    logits, labels = torch.randn(12, 6, generator=g, dtype=torch.float64) * 3, torch.arange(12) % 6
    assert _log_mean_cross_entropy(logits, labels).item() == pytest.approx(
        math.log(F.cross_entropy(logits, labels).item()), rel=1e-12
    )
    big = logits.clone()
    big[torch.arange(12), labels] += 2000  # CE = exp(-2000 + ...) underflows to exactly 0
    assert F.cross_entropy(big, labels).item() == 0
    value = _log_mean_cross_entropy(big, labels).item()
    assert math.isfinite(value) and -2100 < value < -1900


@pytest.mark.parametrize("K,d", [(4, 3), (6, 2), (7, 4)])
def test_spherical_ufm_reaches_theorem_3_3(K, d):
    # At small temperature the UFM of eq. 2 collapses (GNC1, GNC3 -> 0) onto the softmax code (GNC2).
    final = temperature_continuation(K, d, 2, [1.0, 0.1, 0.01], steps=100)[-1].final
    assert final["gnc1"] < 1e-8 and abs(final["gnc3"]) < 1e-8
    assert final["gnc2"] == pytest.approx(softmax_code_optimum(K, d), abs=1e-5)


def test_gnc2_rises_as_temperature_falls():
    # GNC paper Fig. B.4's trend, on the UFM: smaller tau, larger one-vs-rest margin at convergence.
    values = [r.final["gnc2"] for r in temperature_continuation(16, 4, 1, [1.0, 0.05, 0.01], steps=100)]
    assert values[0] < values[1] < values[2]


def test_gradient_descent_and_weight_decay_decrease_their_losses():
    gd = train_ufm(6, 2, 2, optimizer="gd", temperature=0.5, lr=1.0, steps=60, log_every=20)
    losses = [h["loss"] for h in gd.history]
    assert losses[0] > losses[-1] and set(gd.history[0]) == {"step", "loss", "gnc1", "gnc2", "gnc3"}
    wd = train_ufm(5, 2, 2, regularization="weight_decay", temperature=1.0, steps=60, log_every=30)
    start = F.cross_entropy(torch.zeros(10, 5), torch.arange(5).repeat_interleave(2)).item()
    assert wd.final["loss"] < start
    assert torch.allclose(gd.W.norm(dim=1), torch.ones(6, dtype=torch.float64))  # sphere: unit rows


def test_bad_ufm_arguments():
    with pytest.raises(KdcollapseError, match="regularization"):
        train_ufm(4, 2, regularization="dropout")
    with pytest.raises(KdcollapseError, match="optimizer"):
        train_ufm(4, 2, optimizer="adam")
    with pytest.raises(KdcollapseError, match="temperature > 0"):
        train_ufm(4, 2, temperature=0)
