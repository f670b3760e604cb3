"""Every metric of ``kdcollapse.metrics`` declared once: its key, what it means, its paper, whether the
trainer logs it per epoch and whether it needs a classifier.

``kdcollapse.analysis`` derives ``MEANINGS`` (the lines of ``analysis.md``) and ``EPOCH_KEYS`` (the
per-epoch set) from :data:`METRICS`; docs/metrics.md lists exactly these keys (tests/test_metrics_catalog.py
checks both, and that every key a metric returns is declared here). Adding a metric: compute it, add its
line here and its row in docs/metrics.md. The tests read their key sets from here (``source``,
``needs_classifier``, ``prior_weighted``), so a new line needs no edit of a test's list.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kdcollapse.errors import KdcollapseError, unknown_choice

Source = Literal["collapse_metrics", "NearestClassMeanAccuracy", "IntraClassSimilarity", "geometry_alignment"]


@dataclass(frozen=True)
class MetricInfo:
    name: str  # the key in the returned dict, analysis.json and metrics.jsonl
    meaning: str  # one line, for analysis.md
    paper: str  # paper and equation or section ("" for bookkeeping numbers such as ranks)
    source: Source  # what returns it
    per_epoch: bool = False  # logged as train_<name> / test_<name> when analysis.every is set
    needs_classifier: bool = False  # returned only when the linear head's weight W is given
    needs_ood: bool = False  # returned only when the mean feature of out-of-distribution data is given
    prior_weighted: bool = False  # its Σ_B follows ``convention`` (papyan/prior): differs on imbalanced classes


_NC = "Papyan et al. 2020"
_C, _N, _I, _A = "collapse_metrics", "NearestClassMeanAccuracy", "IntraClassSimilarity", "geometry_alignment"

METRICS: tuple[MetricInfo, ...] = (
    MetricInfo("nc1", "(1/K) Tr(Σ_W Σ_B†): within-class spread against class-mean spread; 0 = collapsed (NC1)",
               f"{_NC} (NC1)", _C, per_epoch=True, prior_weighted=True),
    MetricInfo("nc1_svd", "(1/K) Tr(Σ_W Σ_B⁺), Σ_B⁺ from its K − 1 largest eigenvalues (NC1 by SVD)",
               "Han et al. 2022", _C, prior_weighted=True),
    MetricInfo("fuzziness", "Tr(Σ_W Σ_B†) = K · nc1 (VCI paper Sec. 3.2)", "VCI paper Sec. 3.2", _C,
               prior_weighted=True),
    MetricInfo("vci", "1 − Tr(Σ_T† Σ_B)/min(d, K−1): variability a linear probe cannot remove; 0 = collapsed (VCI)",
               "VCI paper Def. 5.3", _C, per_epoch=True),
    MetricInfo("linear_probe_mse", "least squares loss of the best linear probe onto one-hot labels (VCI Thm 5.1)",
               "VCI paper Thm 5.1", _C, per_epoch=True),
    MetricInfo("squared_distance", "Tr Σ_W / Tr Σ_B (Hui et al. 2022)", "Hui et al. 2022; VCI eq. 4", _C,
               per_epoch=True, prior_weighted=True),
    MetricInfo("cosine_within", "mean 1 − cos between features of the same class (Kornblith et al. 2021)",
               "Kornblith et al. 2021", _C, per_epoch=True),
    MetricInfo("class_separation",
               "1 − within-class / overall mean cosine distance; 1 = collapsed (Kornblith et al.)",
               "Kornblith et al. 2021", _C, per_epoch=True),
    MetricInfo("nc2_equinorm", "coefficient of variation of the centred class-mean norms; 0 = equal norms (NC2)",
               f"{_NC} (NC2)", _C),
    MetricInfo("nc2_equiangle", "mean |cos + 1/(K−1)| between centred class means; 0 = simplex ETF angles (NC2)",
               f"{_NC} (NC2)", _C, per_epoch=True),
    MetricInfo("nc2_etf_error",
               "‖G/‖G‖_F − (I − 11ᵀ/K)/√(K−1)‖_F, G the Gram of the centred class means; 0 = simplex ETF (NC2)",
               "Kothapalli 2023; Wu & Papyan 2024", _C),
    MetricInfo("cdnv", "mean over class pairs of (σ_k² + σ_k'²)/(2‖μ_k − μ_k'‖²); 0 = collapsed (CDNV)",
               "Galanti et al. 2022", _C),
    *(MetricInfo(f"nc2g_{kernel}_{stat}",
                 f"{'mean' if stat == 'mean' else 'variance'} over class pairs of the {what} between unit centred "
                 f"class means (hyperspherical uniformity{'; GNC2 of Linguistic Collapse' if kernel == 'log' else ''})",
                 "Liu et al. 2023; Wu & Papyan 2024", _C)
      for kernel, what in (("dist", "distance"), ("log", "log inverse distance"),
                           ("riesz", "Riesz kernel |Δ|^−(d−2)")) for stat in ("mean", "var")),
    MetricInfo("unc3", "variance over classes of w_k · (μ_k − μ̄); 0 = uniform duality (UNC3)",
               "Wu & Papyan 2024", _C, needs_classifier=True),
    MetricInfo("unc3_cosine", "variance over classes of cos(w_k, μ_k − μ̄) (UNC3, scale-free)",
               "Wu & Papyan 2024", _C, needs_classifier=True),
    MetricInfo("nc5_ood_deviation", "mean |cos(μ_k, OOD mean feature)|; 0 = OOD orthogonal to the classes (NC5)",
               "Ammar et al. 2024 (NECO)", _C, needs_ood=True),
    MetricInfo("nc2_equinorm_w", "coefficient of variation of the classifier row norms (NC2 of W)",
               f"{_NC} (NC2)", _C, needs_classifier=True),
    MetricInfo("nc2_equiangle_w", "mean |cos + 1/(K−1)| between classifier rows (NC2 of W)",
               f"{_NC} (NC2)", _C, needs_classifier=True),
    MetricInfo("nc3", "‖W/‖W‖ − M/‖M‖‖²: distance between classifier and centred class means; 0 = self-dual (NC3)",
               f"{_NC} (NC3)", _C, per_epoch=True, needs_classifier=True),
    MetricInfo("nc3_self_duality", "NC2's ETF error of the cross-Gram W M̃ᵀ; 0 = self-dual simplex ETF (NC3)",
               "Kothapalli 2023; Wu & Papyan 2024", _C, needs_classifier=True),
    MetricInfo("gnc1", "NC1 of L2-normalised features with the uncentred Σ_B (GNC1)", "GNC paper Sec. 2.2", _C,
               per_epoch=True, prior_weighted=True),
    MetricInfo("gnc2", "smallest one-vs-rest distance of the unit classifier rows (GNC2, Softmax Code margin)",
               "GNC paper Def. 2.1, eq. 3", _C, needs_classifier=True),
    MetricInfo("gnc2_optimum", "largest possible gnc2 for this (K, d), where known (GNC Thm 3.3)",
               "GNC paper Thm 3.3", _C, needs_classifier=True),
    MetricInfo("gnc3", "mean 1 − cos(w_k, class mean of unit features); 0 = aligned (GNC3)", "GNC paper Sec. 2.2",
               _C, per_epoch=True, needs_classifier=True),
    MetricInfo("classifier_zero_rows", "rows of W that are zero, left out of the metrics of row directions "
               "(nc2_equiangle_w, gnc2, gnc3, unc3_cosine)", "", _C, needs_classifier=True),
    MetricInfo("rank_between", "rank of Σ_B kept by its pseudo-inverse (at most K − 1)", "", _C),
    MetricInfo("rank_total", "rank of Σ_T kept by its pseudo-inverse", "", _C),
    MetricInfo("rank_between_unit", "rank of the GNC1 Σ_B kept by its pseudo-inverse", "", _C),
    MetricInfo("vci_rank", "min(d, K − 1), the rank VCI divides by", "", _C),
    MetricInfo("ncc_accuracy", "accuracy of the nearest-class-mean classifier (NC4)", f"{_NC} (NC4)", _N,
               per_epoch=True),
    MetricInfo("ncc_agreement", "fraction where nearest class mean and network agree; 1 = NC4", f"{_NC} (NC4)", _N),
    MetricInfo("d_intra", "mean exp(φᵀφ⁻) over same-class pairs of unit embeddings; lower = more diverse class",
               "intra-class KD paper §4.2", _I),
    MetricInfo("d_inter", "mean exp(φᵀφ⁻) over pairs of different classes", "intra-class KD paper §4.2", _I),
    MetricInfo("d_ratio", "d_intra / d_inter", "intra-class KD paper §4.2, Thm 1", _I),
    MetricInfo("tuplet_intra", "batch tuplet loss with the anchor's same-class samples as negatives",
               "intra-class KD paper eq. 8", _I),
    MetricInfo("tuplet_inter", "batch tuplet loss with the other classes' samples as negatives",
               "intra-class KD paper eq. 8", _I),
    MetricInfo("tuplet_ratio", "tuplet_intra / tuplet_inter", "intra-class KD paper Thm 2", _I),
    MetricInfo("procrustes_alignment", "student vs teacher class means after the best rotation and scaling; 1 = same "
               "simplex up to rotation and scale", "Schönemann 1966 (orthogonal Procrustes)", _A),
    MetricInfo("procrustes_residual", "relative squared error of the student's rotated class means against the "
               "teacher's (rotation only: scale counts); 0 = equal", "Schönemann 1966 (orthogonal Procrustes)", _A),
    MetricInfo("simplex_similarity", "cosine between the two models' K x K class-mean Grams (linear CKA of the class "
               "means); 1 = same simplex", "Kornblith et al. 2019 (CKA)", _A),
    MetricInfo("simplex_angle", "arccos of simplex_similarity, degrees", "Kornblith et al. 2019 (CKA)", _A),
    MetricInfo("classifier_procrustes_alignment", "procrustes_alignment of the two classifiers' rows",
               "Schönemann 1966 (orthogonal Procrustes)", _A, needs_classifier=True),
    MetricInfo("classifier_similarity", "cosine between the two classifiers' K x K row Grams",
               "Kornblith et al. 2019 (CKA)", _A, needs_classifier=True),
    MetricInfo("classifier_angle", "arccos of classifier_similarity, degrees", "Kornblith et al. 2019 (CKA)", _A,
               needs_classifier=True),
    MetricInfo("feature_cka", "linear CKA of the two models' penultimate features (biased HSIC)",
               "Kornblith et al. 2019 (CKA)", _A),
    MetricInfo("feature_cka_unbiased", "linear CKA from the unbiased HSIC estimator; ≈ 0 for independent features",
               "Song et al. 2012; Nguyen et al. 2021", _A),
)


def metric_info(name: str) -> MetricInfo:
    """The catalogue entry of a metric key."""
    for info in METRICS:
        if info.name == name:
            return info
    raise KdcollapseError(unknown_choice("metric", name, [m.name for m in METRICS]))
