"""The one path of every verdict on the results pages (study summaries and ``paired_comparisons``): Holm's correction
across a page's tests, then each test's word by ``verdict``'s rule with its own noise floor and direction."""

from __future__ import annotations

import math

import pytest

from kdcollapse.errors import KdcollapseError
from kdcollapse.report import corrected_verdicts, holm, verdict


def test_each_test_gets_holm_p_and_its_own_floor_and_words():
    differences, p = [2.0, -2.0, 0.2, 3.0, -1.0, 5.0], [0.001, 0.002, 0.003, 0.004, math.nan, 0.5]
    floors = [0.5, 0.5, 0.5, 0.0, 0.0, 0.0]
    words = [("better", "worse"), ("better", "worse"), ("better", "worse"), ("worse", "better"), ("higher", "lower"),
             ("higher", "lower")]
    out = corrected_verdicts(differences, p, alpha=0.05, noise_floors=floors, words=words)
    assert [q for q, _ in out][:4] == holm(p)[:4] and math.isnan(out[4][0])
    assert [w for _, w in out] == ["better", "worse", "no difference shown", "worse", "not tested",
                                   "no difference shown"]  # 3.0 where lower is better is "worse"
    same = [verdict(d, q, noise_floor=f) for d, q, f in zip(differences, holm(p), floors)]
    assert same[:3] == [w for _, w in out][:3]
    # one floor and one pair of words for every test
    assert corrected_verdicts([-1.0, 1.0], [0.01, 0.01], words=("higher", "lower")) == [(0.02, "lower"),
                                                                                        (0.02, "higher")]
    assert corrected_verdicts([], []) == []
    with pytest.raises(KdcollapseError, match="one difference, noise floor and pair of words per test"):
        corrected_verdicts([1.0], [0.01, 0.02])
