"""mean_std and paired_t_test against closed forms of Student's t distribution (df = 1 and df = 2)."""

import math

import pytest

from kdcollapse.errors import KdcollapseError
from kdcollapse.report import mean_std, paired_t_test


def test_mean_std_uses_the_sample_std():
    assert mean_std([1.0, 2.0, 3.0]) == "2.00 ± 1.00"
    assert mean_std([85.0]) == "85.00 ± 0.00"


def test_paired_t_test_df2_closed_form():
    # d = (1, 2, 3): t = 2 / (1 / sqrt 3); for df = 2 the two-sided p is 1 - |t| / sqrt(t^2 + 2)
    diff, p = paired_t_test([11.0, 12.0, 13.0], [10.0, 10.0, 10.0])
    t = 2.0 * math.sqrt(3.0)
    assert diff == pytest.approx(2.0)
    assert p == pytest.approx(1.0 - t / math.sqrt(t * t + 2.0), rel=1e-9)


def test_paired_t_test_df1_closed_form_and_sign():
    # d = (-1, -3): t = -2; for df = 1 (Cauchy) the two-sided p is 1 - (2 / pi) atan|t|
    diff, p = paired_t_test([0.0, 0.0], [1.0, 3.0])
    assert diff == pytest.approx(-2.0)
    assert p == pytest.approx(1.0 - 2.0 / math.pi * math.atan(2.0), rel=1e-9)


def test_paired_t_test_degenerate_cases():
    assert paired_t_test([1.0, 2.0], [1.0, 2.0]) == (0.0, 1.0)
    assert paired_t_test([2.0, 3.0], [1.0, 2.0]) == (1.0, 0.0)
    assert math.isnan(paired_t_test([2.0], [1.0])[1])
    with pytest.raises(KdcollapseError, match="pairs"):
        paired_t_test([1.0, 2.0], [1.0])
