"""Classifier geometry (GNC paper), the mathematics alone: exact one-vs-rest distances, softmax and Tammes
codes, their bounds, and code files. The unit-norm classifier heads built on these codes are in
:mod:`kdcollapse.models.heads`; the unconstrained-features-model experiments in
:mod:`kdcollapse.experiments.ufm`.

All distances are Euclidean distances between unit vectors (not squared); see docs/geometry.md.
"""

from kdcollapse.geometry._bounds import (
    TAMMES_OPTIMA,
    SoftmaxCodeBounds,
    check_sizes,
    softmax_code_bounds,
    softmax_code_optimum,
    tammes_optimum,
)
from kdcollapse.geometry._codes import SphericalCode, closed_form_code, simplex_etf, softmax_code, tammes_code
from kdcollapse.geometry._distances import (
    NearestPoints,
    nearest_points,
    one_vs_one_distance,
    one_vs_rest_distances,
    optimal_features,
    unit_rows,
)
from kdcollapse.geometry._io import SUFFIXES, load_matrix, save_code

__all__ = [
    "NearestPoints",
    "SUFFIXES",
    "SoftmaxCodeBounds",
    "SphericalCode",
    "TAMMES_OPTIMA",
    "check_sizes",
    "closed_form_code",
    "load_matrix",
    "nearest_points",
    "one_vs_one_distance",
    "one_vs_rest_distances",
    "optimal_features",
    "save_code",
    "simplex_etf",
    "softmax_code",
    "softmax_code_bounds",
    "softmax_code_optimum",
    "tammes_code",
    "tammes_optimum",
    "unit_rows",
]
