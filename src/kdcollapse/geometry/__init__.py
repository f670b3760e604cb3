"""Classifier geometry (GNC paper): exact one-vs-rest distances, softmax and Tammes codes, bounds,
unconstrained-features-model experiments and unit-norm classifier heads.

All distances are Euclidean distances between unit vectors (not squared); see docs/geometry.md.
"""

from kdcollapse.geometry._bounds import (
    TAMMES_OPTIMA,
    SoftmaxCodeBounds,
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
from kdcollapse.geometry._io import load_matrix, save_code
from kdcollapse.geometry._ufm import UFMResult, train_ufm
from kdcollapse.geometry.heads import (
    HEAD_KINDS,
    ClassMeanFeatureHead,
    CosineHead,
    FixedHead,
    head_from_spec,
    make_code,
    make_head,
)

__all__ = [
    "ClassMeanFeatureHead",
    "CosineHead",
    "FixedHead",
    "HEAD_KINDS",
    "NearestPoints",
    "SoftmaxCodeBounds",
    "SphericalCode",
    "TAMMES_OPTIMA",
    "UFMResult",
    "closed_form_code",
    "head_from_spec",
    "load_matrix",
    "make_code",
    "make_head",
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
    "train_ufm",
    "unit_rows",
]
