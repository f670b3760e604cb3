"""Mean ± std over seeds and the paired t-test across seeds, for the results pages."""

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
