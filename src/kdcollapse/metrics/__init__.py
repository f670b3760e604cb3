"""Collapse metrics from one streaming pass: NC1-NC4 (Papyan et al. 2020), VCI and the linear-probe MSE
(Xu & Liu), GNC1-GNC3 (generalized neural collapse), squared distance, cosine class separation.

``FeatureStatistics`` (a ``Metric``, the torchmetrics protocol) accumulates mergeable sufficient statistics;
``collapse_metrics(stats, classifier_weight)`` turns them into numbers. See docs/metrics.md.
"""

from kdcollapse.metrics import functional
from kdcollapse.metrics._alignment import PairedFeatures, geometry_alignment
from kdcollapse.metrics._catalog import METRICS, MetricInfo, metric_info
from kdcollapse.metrics._intra_class import IntraClassSimilarity, intra_inter_distances, similarity_sums
from kdcollapse.metrics._linalg import psd_pinv
from kdcollapse.metrics._margin import margin
from kdcollapse.metrics._metric import Metric
from kdcollapse.metrics._ncc import NearestClassMeanAccuracy, ncc_accuracy, nearest_class_mean
from kdcollapse.metrics._ood import FeatureMean
from kdcollapse.metrics._statistics import (ACCUMULATION_BOUND, FeatureStatistics, accumulation_dtype, collapse_metrics,
                                           covariance_spectra)
from kdcollapse.metrics._transfer import mean_log_odds_gain

__all__ = [
    "METRICS",
    "Metric",
    "MetricInfo",
    "FeatureStatistics",
    "FeatureMean",
    "PairedFeatures",
    "geometry_alignment",
    "ACCUMULATION_BOUND",
    "accumulation_dtype",
    "IntraClassSimilarity",
    "NearestClassMeanAccuracy",
    "collapse_metrics",
    "covariance_spectra",
    "functional",
    "intra_inter_distances",
    "margin",
    "mean_log_odds_gain",
    "metric_info",
    "nearest_class_mean",
    "ncc_accuracy",
    "psd_pinv",
    "similarity_sums",
]
