"""What is known about softmax codes and Tammes codes in closed form (GNC paper Thm 3.3 and 3.9)."""

from __future__ import annotations

import math
from typing import NamedTuple

from kdcollapse.errors import KdcollapseError

# Proven optima of the Tammes problem (GNC eq. 11) as the largest minimal angle in degrees, keyed by
# (d, K); from the tables of spherical codes (Cohn 2022).
TAMMES_OPTIMA: dict[tuple[int, int], float] = {
    (3, 4): 109.4712206,
    (3, 6): 90.0,
    (3, 7): 77.8695422,
    (3, 8): 74.8584922,
    (3, 9): 70.5287794,
    (3, 10): 66.1468220,
    (3, 12): 63.4349488,
    (3, 13): 57.1367031,
    (3, 14): 55.6705700,
    (3, 24): 43.6907671,
    (4, 10): 80.4059318,
    (4, 120): 36.0,
}


class SoftmaxCodeBounds(NamedTuple):
    """Bounds of GNC Theorem 3.9 on max_W rho_one-vs-rest(W) (a distance, not squared)."""

    lower: float
    upper: float
    valid: bool  # the theorem assumes K >= sqrt(2 pi sqrt(e) d); outside it the numbers prove nothing


def check_sizes(num_classes: int, dim: int) -> None:
    """Raise a ``KdcollapseError`` unless K >= 2 and d >= 1 are integers (the sizes of a code)."""
    if int(num_classes) != num_classes or num_classes < 2:
        raise KdcollapseError(f"the number of classes K must be an integer >= 2, got {num_classes}")
    if int(dim) != dim or dim < 1:
        raise KdcollapseError(f"the dimension d must be an integer >= 1, got {dim}")


def softmax_code_bounds(num_classes: int, dim: int) -> SoftmaxCodeBounds:
    """Lower and upper bounds on the softmax-code distance for K classes in R^d (GNC Thm 3.9, eq. 13).

        lower = 1/2 [ (sqrt(pi)/K) Gamma((d+1)/2) / Gamma(d/2 + 1) ]^(2/(d-1))
        upper = 2   [ (2 sqrt(pi)/K) Gamma((d+1)/2) / Gamma(d/2) ]^(1/(d-1))

    valid for K >= sqrt(2 pi sqrt(e) d) (``valid`` says whether that holds). Needs d >= 2.

    Example:
        >>> b = softmax_code_bounds(100, 10)
        >>> round(b.lower, 4), round(b.upper, 4), b.valid
        (0.1697, 1.5049, True)
    """
    check_sizes(num_classes, dim)
    if dim < 2:
        raise KdcollapseError("softmax_code_bounds needs d >= 2 (the exponents divide by d - 1)")
    K, d = num_classes, dim
    log_lower = math.log(math.sqrt(math.pi) / K) + math.lgamma((d + 1) / 2) - math.lgamma(d / 2 + 1)
    log_upper = math.log(2 * math.sqrt(math.pi) / K) + math.lgamma((d + 1) / 2) - math.lgamma(d / 2)
    return SoftmaxCodeBounds(
        lower=0.5 * math.exp(2 * log_lower / (d - 1)),
        upper=2 * math.exp(log_upper / (d - 1)),
        valid=K >= math.sqrt(2 * math.pi * math.sqrt(math.e) * d),
    )


def softmax_code_optimum(num_classes: int, dim: int) -> float | None:
    """max_W rho_one-vs-rest(W) where GNC Theorem 3.3 gives it in closed form, else None.

    d = 2: 1 - cos(2 pi / K) (uniform circle); K <= d + 1: K / (K - 1) (simplex ETF);
    d + 1 < K <= 2d: 1 (vertices of a cross-polytope); d = 1, K >= 3: 0 (two of the points coincide).
    All are distances, not squared distances.
    """
    check_sizes(num_classes, dim)
    K, d = num_classes, dim
    if K <= d + 1:
        return K / (K - 1)
    if d == 1:
        return 0.0
    if d == 2:
        return 1 - math.cos(2 * math.pi / K)
    if K <= 2 * d:
        return 1.0
    return None


def tammes_optimum(num_classes: int, dim: int) -> float | None:
    """Proven largest minimal angle (degrees) of K points on the sphere of R^d, or None if not tabled.

    Covers d = 2 (360/K), K <= d + 1 (the simplex, arccos(-1/(K-1))), d + 1 < K <= 2d (90 degrees:
    a cross-polytope subset; Rankin's bound) and the table ``TAMMES_OPTIMA``.
    """
    check_sizes(num_classes, dim)
    K, d = num_classes, dim
    if K <= d + 1:
        return math.degrees(math.acos(-1 / (K - 1)))
    if d == 2:
        return 360 / K
    if K <= 2 * d:
        return 90.0
    return TAMMES_OPTIMA.get((d, K))
