"""Float32 accumulation of the K x d class sums (``FeatureStatistics(accumulate="float32" | "auto")``): every
metric within the stated tolerance (1e-4 relative, 1e-7 absolute) of float64 accumulation on small problems,
streamed in batches and merged from halves with different shifts; the automatic rule and its errors."""

from __future__ import annotations

import pytest
import torch

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import ACCUMULATION_BOUND, FeatureStatistics, accumulation_dtype, collapse_metrics

RTOL, ATOL = 1e-4, 1e-7  # the tolerance docs/metrics.md states for float32 accumulation


def problem(num_classes: int, dim: int, samples: int = 3000, offset: float = 3.0, seed: int = 0):
    """Imbalanced Gaussian classes around a common offset, every class present, and a classifier."""
    g = torch.Generator().manual_seed(seed)
    means = 2 * torch.randn(num_classes, dim, generator=g, dtype=torch.float64) + offset
    labels = torch.randint(0, num_classes, (samples,), generator=g) ** 2 % num_classes  # imbalanced
    labels[:num_classes] = torch.arange(num_classes)
    features = means[labels] + torch.randn(samples, dim, generator=g, dtype=torch.float64)
    return features, labels, torch.randn(num_classes, dim, generator=g, dtype=torch.float64)


def streamed(features, labels, num_classes, accumulate, batch=256):
    stats = FeatureStatistics(num_classes, features.shape[1], accumulate=accumulate)
    for h, y in zip(features.split(batch), labels.split(batch)):
        stats.update(h, y)
    return stats


def assert_close(ours: dict, reference: dict) -> None:
    assert set(ours) == set(reference)
    for key, value in reference.items():
        if value.is_floating_point():
            assert float(ours[key]) == pytest.approx(float(value), rel=RTOL, abs=ATOL, nan_ok=True), key
        else:
            assert int(ours[key]) == int(value), key


@pytest.mark.parametrize(("num_classes", "dim"), [(40, 24), (12, 32)])  # K > d, and d > K - 1 (Sigma_B singular)
@pytest.mark.parametrize("gnc_convention", ["paper", "official"])
def test_float32_accumulation_matches_float64(num_classes, dim, gnc_convention):
    features, labels, weight = problem(num_classes, dim)
    reference = streamed(features, labels, num_classes, "float64")
    stats = streamed(features, labels, num_classes, "float32")
    assert stats.accumulate == "float32" and stats.class_sums.dtype == stats.unit_class_sums.dtype == torch.float32
    assert stats.moment.dtype == stats.class_square_sums.dtype == torch.float64  # only the K x d sums shrink
    expected = collapse_metrics(reference, weight, gnc_convention=gnc_convention)
    assert_close(collapse_metrics(stats, weight, gnc_convention=gnc_convention, tile=7), expected)
    # Two halves with different shifts, merged (the DDP path re-centres the same way), equal the whole.
    halves = [streamed(features[part], labels[part], num_classes, "float32")
              for part in (slice(0, 1700), slice(1700, None))]
    halves[0].merge_state(halves[1])
    assert halves[0].class_sums.dtype == torch.float32
    assert_close(collapse_metrics(halves[0], weight, gnc_convention=gnc_convention), expected)


def test_the_automatic_rule_and_its_errors():
    assert accumulation_dtype(49_152, 4_096, "auto") == torch.float64  # 3.2 GB of float64 sums: under 4 GiB
    assert accumulation_dtype(128_256, 4_096, "auto") == torch.float32  # 8.4 GB: over
    assert accumulation_dtype(128_256, 4_096) == torch.float64  # the default is float64 whatever the size
    assert accumulation_dtype(10, 10, "auto", bound=1600) == torch.float64  # 2 * 10 * 10 * 8 = 1600 bytes
    assert accumulation_dtype(10, 10, "auto", bound=1599) == torch.float32
    assert ACCUMULATION_BOUND == 4 * 2**30
    assert FeatureStatistics(10, 10, accumulate="auto").class_sums.dtype == torch.float64
    with pytest.raises(KdcollapseError, match="unknown accumulate 'half'; choose one of float64, float32, auto"):
        FeatureStatistics(3, 2, accumulate="half")
    # The states keep their dtypes under .to(dtype), as the float64 ones do.
    stats = FeatureStatistics(3, 2, accumulate="float32").to(torch.float64)
    assert stats.class_sums.dtype == torch.float32 and stats.moment.dtype == torch.float64
