"""Mean ± std over seeds, the paired t-test across seeds, Holm's correction across a page's comparisons, the
confidence interval of a paired difference, and the verdict word chosen by rule from them, for the results pages."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence

from kdcollapse.errors import KdcollapseError


def mean_std(values: Sequence[float], digits: int = 2) -> str:
    """``"mean ± std"`` with the sample standard deviation (n − 1); a single value has std 0."""
    if len(values) == 0:
        raise KdcollapseError("mean_std needs at least one value, got none")
    std = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.{digits}f} ± {std:.{digits}f}"


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> tuple[float, float]:
    """Two-sided paired t-test of ``a − b`` (pairs: the same seed): ``(mean difference, p-value)``.

    ``p`` is ``nan`` when it is undefined: fewer than two pairs, or all differences equal and non-zero
    gives ``0.0`` (t is infinite) and all zero gives ``1.0``.
    """
    if len(a) != len(b):
        raise KdcollapseError(f"paired_t_test needs pairs: got {len(a)} and {len(b)} values")
    d = [x - y for x, y in zip(a, b)]
    if len(d) < 2:
        return (d[0] if d else math.nan), math.nan
    mean, sd = statistics.mean(d), statistics.stdev(d)
    if sd == 0.0:
        return mean, (1.0 if mean == 0.0 else 0.0)
    from scipy.stats import t as student_t

    t = mean / (sd / math.sqrt(len(d)))
    return mean, float(2.0 * student_t.sf(abs(t), df=len(d) - 1))


def holm(p_values: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values, in the order given; ``nan`` entries (no test) are left out of the
    family and stay ``nan``.

    >>> [round(p, 3) for p in holm([0.01, 0.04, 0.03, math.nan])]
    [0.03, 0.06, 0.06, nan]
    """
    bad = [p for p in p_values if not (math.isnan(p) or 0 <= p <= 1)]
    if bad:
        raise KdcollapseError(f"holm takes p-values in [0, 1] (nan: no test), got {bad[0]!r}")
    tested = sorted((p, i) for i, p in enumerate(p_values) if not math.isnan(p))
    adjusted, running = [math.nan] * len(p_values), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (len(tested) - rank) * p))
        adjusted[i] = running
    return adjusted


def mean_difference_ci(a: Sequence[float], b: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """The two-sided ``level`` confidence interval of the mean paired difference ``a − b`` (Student's t, n − 1
    degrees of freedom); ``(nan, nan)`` with fewer than two pairs."""
    if len(a) != len(b):
        raise KdcollapseError(f"mean_difference_ci needs pairs: got {len(a)} and {len(b)} values")
    d = [x - y for x, y in zip(a, b)]
    if len(d) < 2:
        return math.nan, math.nan
    from scipy.stats import t as student_t

    half = float(student_t.ppf(0.5 + level / 2, df=len(d) - 1)) * statistics.stdev(d) / math.sqrt(len(d))
    return statistics.mean(d) - half, statistics.mean(d) + half


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's correlation coefficient of paired values; ``nan`` with fewer than two pairs or a constant side.

    >>> pearson([1, 2, 3], [2, 4, 7]) > 0.99, pearson([1, 2, 3], [3, 2, 1])
    (True, -1.0)
    """
    if len(x) != len(y):
        raise KdcollapseError(f"pearson needs pairs: got {len(x)} and {len(y)} values")
    if len(x) < 2:
        return math.nan
    try:
        return statistics.correlation(x, y)
    except statistics.StatisticsError:  # a constant side
        return math.nan


EXACT_SPEARMAN_ITEMS = 8  # up to this many items a rank correlation's p counts every permutation (8! = 40,320)


def spearman(x: Sequence[float], y: Sequence[float]) -> tuple[float, float]:
    """Spearman's ρ of ``x`` and ``y`` (ties averaged) and its two-sided p. Up to ``EXACT_SPEARMAN_ITEMS`` items
    the p is exact: the share of the n! orderings of ``y``'s ranks whose |ρ| is at least the observed (a relative
    slack of 1e-9 for rounding), so 3 items in perfect order give 1/3, not the t approximation's 0; beyond, scipy's
    t approximation. ``(nan, nan)`` with fewer than 3 items or a constant side.

    >>> spearman([1, 2, 3], [10, 20, 30])
    (1.0, 0.3333333333333333)
    """
    if len(x) != len(y):
        raise KdcollapseError(f"spearman needs pairs: got {len(x)} and {len(y)} values")
    n = len(x)
    if n < 3:
        return math.nan, math.nan
    from scipy.stats import rankdata, spearmanr

    if n > EXACT_SPEARMAN_ITEMS:
        rho, p = spearmanr(x, y)
        return float(rho), float(p)
    import itertools

    import numpy as np

    rx, ry = (rankdata(v) - (n + 1) / 2 for v in (x, y))
    norm = math.sqrt(float(rx @ rx) * float(ry @ ry))
    if norm == 0:
        return math.nan, math.nan
    rho = float(rx @ ry) / norm
    orders = np.array(list(itertools.permutations(range(n))))
    permuted = np.abs(ry[orders] @ rx) / norm
    return max(-1.0, min(1.0, rho)), float(np.mean(permuted >= abs(rho) * (1 - 1e-9)))


def partial_spearman(x: Sequence[float], y: Sequence[float], z: Sequence[float]) -> tuple[float, float]:
    """Spearman's rank correlation of ``x`` and ``y`` controlling for ``z`` (e.g. a model's size) and its
    two-sided p: the partial Pearson correlation of the ranks (ties averaged),
    (r_xy − r_xz r_yz) / √((1 − r_xz²)(1 − r_yz²)). Up to ``EXACT_SPEARMAN_ITEMS`` items the p is exact, as
    :func:`spearman`'s: the share of the n! orderings of ``x``'s ranks against the (y, z) pairs whose partial |r|
    is at least the observed, among those that have one (not x ordered as z, or reversed; 4 items in perfect
    partial order do not give p = 0); beyond, the t test
    t = r √((n − 3)/(1 − r²)) with n − 3 degrees of freedom (one controlled variable; p = 0 at |r| = 1).
    ``(nan, nan)`` with fewer than 4 items or a constant rank side.

    >>> r, p = partial_spearman([3, 1, 4, 1, 5, 9, 2, 6], [2, 7, 1, 8, 2, 8, 1, 8], [1, 2, 3, 4, 5, 6, 7, 8])
    >>> round(r, 3), round(p, 3)
    (0.089, 0.844)
    """
    if not len(x) == len(y) == len(z):
        raise KdcollapseError(f"partial_spearman needs triples: got {len(x)}, {len(y)} and {len(z)} values")
    n = len(x)
    if n < 4:
        return math.nan, math.nan
    import numpy as np
    from scipy.stats import rankdata
    from scipy.stats import t as student_t

    rx, ry, rz = (rankdata(v) - (n + 1) / 2 for v in (x, y, z))
    norms = [math.sqrt(float(v @ v)) for v in (rx, ry, rz)]
    if min(norms) == 0:
        return math.nan, math.nan
    rx, ry, rz = (v / norm for v, norm in zip((rx, ry, rz), norms))
    r_yz = float(ry @ rz)

    def partial(ranks):  # rows of x's (scaled, centred) ranks → their partial r with y given z
        r_xy, r_xz = ranks @ ry, ranks @ rz
        denominator = (1 - r_xz ** 2) * (1 - r_yz ** 2)
        # |r| = 1 between two rank vectors is exact collinearity, which rounding may leave at 1 − 1e-16: no partial r
        defined = (1 - np.abs(r_xz) > 1e-9) & (1 - abs(r_yz) > 1e-9)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(defined, (r_xy - r_xz * r_yz) / np.sqrt(np.maximum(denominator, 1e-300)), np.nan)

    r = float(partial(rx[None])[0])
    if math.isnan(r):
        return math.nan, math.nan
    r = max(-1.0, min(1.0, r))
    if n <= EXACT_SPEARMAN_ITEMS:
        import itertools

        permuted = np.abs(partial(rx[np.array(list(itertools.permutations(range(n))))]))
        permuted = permuted[~np.isnan(permuted)]  # an ordering of x's ranks as z's (or reversed) has no partial r
        return r, float(np.mean(permuted >= abs(r) * (1 - 1e-9)))
    if abs(r) == 1.0:
        return r, 0.0
    t = r * math.sqrt((n - 3) / (1 - r * r))
    return r, float(2 * student_t.sf(abs(t), df=n - 3))


VERDICTS = ("better", "worse", "no difference shown", "not tested")


def verdict(difference: float, corrected_p: float, *, alpha: float = 0.05, noise_floor: float = 0.0) -> str:
    """The word for ``a − b`` (higher is better): "better" or "worse" only when the corrected p-value is below
    ``alpha`` *and* the mean difference is at least ``noise_floor`` in size; "not tested" without a p-value
    (fewer than two pairs); otherwise "no difference shown" — which is not a claim of equality.

    >>> verdict(2.0, 0.01, noise_floor=0.5), verdict(-2.0, 0.01), verdict(0.2, 0.01, noise_floor=0.5)
    ('better', 'worse', 'no difference shown')
    """
    if not 0 < alpha < 1 or not noise_floor >= 0:
        raise KdcollapseError(f"verdict needs 0 < alpha < 1 and noise_floor >= 0, got alpha={alpha!r}, "
                              f"noise_floor={noise_floor!r}")
    if math.isnan(corrected_p):
        return "not tested"
    if corrected_p < alpha and abs(difference) >= noise_floor:
        return "better" if difference > 0 else "worse"
    return "no difference shown"
