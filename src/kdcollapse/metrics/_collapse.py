r"""Collapse metrics (NC1-NC3, VCI, GNC1-GNC3, ...) as functions of ``FeatureStatistics`` states.

Class prior. The papers state their covariances for balanced classes (n samples per class). Here every
covariance uses the empirical class prior :math:`\pi_k = n_k/N`:

.. math::
    \mu_G = \textstyle\sum_k \pi_k \mu_k,\quad
    \Sigma_W = \tfrac1N \sum_i (h_i-\mu_{y_i})(\cdot)^\top,\quad
    \Sigma_B = \sum_k \pi_k (\mu_k-\mu_G)(\cdot)^\top,\quad
    \Sigma_T = \tfrac1N \sum_i (h_i-\mu_G)(\cdot)^\top = \Sigma_W + \Sigma_B .

With balanced classes :math:`\pi_k = 1/K` and these are exactly the papers' definitions.
With imbalanced classes it is the only weighting that (i) is a function of one global second moment
(a class-uniform Sigma_W would need K separate d x d moments) and (ii) keeps Sigma_T = Sigma_W + Sigma_B,
on which VCI Thm 5.2 and Cor. 5.4 rest. ``linear_probe_mse`` is the exact minimum of the probe loss
:math:`\frac1{2N}\sum_i \lVert W h_i + b - e_{y_i}\rVert^2` for any prior,
:math:`\tfrac12\,[1 - \sum_k \pi_k^2 - \sum_k \pi_k^2 (\mu_k-\mu_G)^\top \Sigma_T^\dagger (\mu_k-\mu_G)]`,
which is VCI Thm 5.1 when :math:`\pi_k = 1/K`. The class-level metrics (cosine distances, NC2, NC3, GNC3)
count each class once, as in their papers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry import one_vs_rest_distances, softmax_code_optimum
from kdcollapse.metrics._linalg import psd_pinv, symmetric_from_upper

if TYPE_CHECKING:
    from kdcollapse.metrics._statistics import FeatureStatistics


@dataclass(frozen=True)
class Scatter:
    """Class means and covariances of one feature map under the empirical class prior (float64)."""

    prior: Tensor  # (K,) pi_k = n_k / N
    class_means: Tensor  # (K, d) mu_k
    global_mean: Tensor  # (d,) mu_G
    within: Tensor  # (d, d) Sigma_W
    between: Tensor  # (d, d) Sigma_B
    total: Tensor  # (d, d) Sigma_T


def scatter(stats: FeatureStatistics, *, unit: bool) -> Scatter:
    """Means and covariances of the raw (``unit=False``) or L2-normalised features from the states."""
    counts = _checked_counts(stats)
    prefix = "unit_" if unit else ""
    shift, class_sums = getattr(stats, prefix + "shift"), getattr(stats, prefix + "class_sums")
    n = counts.to(torch.float64)
    prior = n / n.sum()
    means = class_sums / n[:, None]  # mu_k - shift
    mean = class_sums.sum(0) / n.sum()  # mu_G - shift
    centred = means - mean
    total = symmetric_from_upper(getattr(stats, prefix + "moment")) / n.sum() - torch.outer(mean, mean)
    between = (centred * prior[:, None]).mT @ centred
    return Scatter(prior, means + shift, mean + shift, total - between, between, total)


def covariance_spectra(stats: FeatureStatistics) -> dict[str, Tensor]:
    """Eigenvalues, largest first, of Sigma_W, Sigma_B and Sigma_T of the raw features (float64, ``(d,)``
    each; keys ``within``, ``between``, ``total``), gathered across processes like ``compute()``.

    The VCI paper (Sec. 4.3, Fig. 2) plots the Sigma_B and Sigma_T spectra to show why Tr(Sigma_T^+ Sigma_B)
    is stable where Tr(Sigma_W Sigma_B^+) is not: Sigma_B has at most K - 1 non-zero eigenvalues and
    rounding fills the rest with tiny ones, while Sigma_T's spectrum is larger and flatter.
    """
    with stats.sync_context(dist_sync_fn=stats.dist_sync_fn, should_sync=stats.sync_on_compute):
        raw = scatter(stats, unit=False)
    return {name: torch.linalg.eigvalsh(getattr(raw, name)).flip(0) for name in ("within", "between", "total")}


def _checked_counts(stats: FeatureStatistics) -> Tensor:
    counts = stats.class_counts
    if int(counts.sum()) == 0:
        raise KdcollapseError("FeatureStatistics holds no samples: call update(features, labels) first")
    empty = (counts == 0).nonzero().flatten().tolist()
    if empty:
        shown = ", ".join(map(str, empty[:10])) + (", ..." if len(empty) > 10 else "")
        raise KdcollapseError(
            f"{len(empty)} of {stats.num_classes} classes have no samples (classes {shown}); every class "
            "needs at least one sample. Relabel the classes present as 0..K'-1 and use num_classes=K' to "
            "measure those."
        )
    return counts


def _variability(raw: Scatter, rtol: float) -> dict[str, Tensor]:
    """NC1 / fuzziness (Papyan et al. 2020), VCI and the linear-probe MSE (VCI paper Def. 5.3, Thm 5.1),
    squared distance (Hui et al. 2022, VCI paper eq. 4)."""
    num_classes, dim = raw.prior.numel(), raw.total.shape[0]
    between_pinv, rank_between = psd_pinv(raw.between, rtol=rtol)
    fuzziness = (raw.within * between_pinv).sum()  # Tr(Sigma_W Sigma_B^+), both symmetric
    if rank_between == 0:  # every class mean at mu_G: undefined
        fuzziness = torch.tensor(math.nan, dtype=torch.float64)
    total_pinv, rank_total = psd_pinv(raw.total, rtol=rtol)
    centred = raw.class_means - raw.global_mean
    explained = ((centred @ total_pinv) * centred).sum(1)  # (mu_k - mu_G)^T S_T^+ (mu_k - mu_G)
    vci_rank = min(dim, num_classes - 1)  # rank(Sigma_B) as the VCI paper takes it (Sec. 5)
    return {
        "nc1": fuzziness / num_classes,
        "fuzziness": fuzziness,
        "vci": 1 - (raw.prior * explained).sum() / vci_rank,  # Tr(S_T^+ S_B) = sum_k pi_k explained_k
        "linear_probe_mse": 0.5 * (1 - raw.prior.square().sum() - (raw.prior.square() * explained).sum()),
        "squared_distance": raw.within.trace() / raw.between.trace(),
        "rank_between": torch.tensor(rank_between),
        "rank_total": torch.tensor(rank_total),
        "vci_rank": torch.tensor(vci_rank),
    }


def _cosine(unit_means: Tensor) -> dict[str, Tensor]:
    r"""Kornblith et al. 2021 (VCI paper Sec. 3.2), from the class means :math:`\bar u_k` of unit features:
    :math:`\bar d_{within} = \frac1K\sum_k (1 - \lVert\bar u_k\rVert^2)` (the mean of 1 - cos over all
    within-class pairs), :math:`\bar d_{total} = 1 - \lVert\frac1K\sum_k \bar u_k\rVert^2`."""
    within = (1 - unit_means.square().sum(1)).mean()
    total = 1 - unit_means.mean(0).square().sum()
    return {"cosine_within": within, "class_separation": 1 - within / total}


def _equinorm_equiangle(vectors: Tensor) -> tuple[Tensor, Tensor]:
    """NC2 (Papyan et al. 2020): coefficient of variation of the norms (std with Bessel's correction, as
    ``torch.std``) and the mean over k != k' of ``|cos(v_k, v_k') + 1/(K-1)|``; rows of ``vectors`` (K, d)."""
    num_classes = vectors.shape[0]
    norms = vectors.norm(dim=1)
    unit = F.normalize(vectors, dim=1)
    off_diagonal = ~torch.eye(num_classes, dtype=torch.bool, device=vectors.device)
    cosines = (unit @ unit.mT)[off_diagonal]
    return norms.std() / norms.mean(), (cosines + 1 / (num_classes - 1)).abs().mean()


def _generalized(unit: Scatter, rtol: float) -> dict[str, Tensor]:
    r"""GNC1 (GNC paper Sec. 2.2) on unit features, with the paper's uncentred
    :math:`\Sigma_B = \sum_k \pi_k \bar h_k \bar h_k^\top` (= (1/K) sum_k for balanced classes)."""
    between = (unit.class_means * unit.prior[:, None]).mT @ unit.class_means
    between_pinv, rank = psd_pinv(between, rtol=rtol)
    return {
        "gnc1": (unit.within * between_pinv).sum() / unit.prior.numel(),
        "rank_between_unit": torch.tensor(rank),
    }


def _classifier(raw: Scatter, unit: Scatter, weight: Tensor) -> dict[str, Tensor]:
    """Metrics of the classifier rows w_k: NC2 on W, NC3 (Papyan et al. 2020), GNC2 and GNC3 (GNC paper)."""
    optimum = softmax_code_optimum(*weight.shape)

    num_classes, dim = weight.shape
    centred = raw.class_means - raw.global_mean
    unit_weight = F.normalize(weight, dim=1)
    equinorm, equiangle = _equinorm_equiangle(weight)
    distances = one_vs_rest_distances(unit_weight).to(torch.float64)
    return {
        "nc2_equinorm_w": equinorm,
        "nc2_equiangle_w": equiangle,
        "nc3": (weight / weight.norm() - centred / centred.norm()).square().sum(),
        "gnc2": distances.min(),
        "gnc2_optimum": torch.tensor(math.nan if optimum is None else optimum, dtype=torch.float64),
        "gnc3": (1 - (unit_weight * unit.class_means).sum(1)).mean(),
    }


def metrics_from_statistics(
    stats: FeatureStatistics, classifier_weight: Tensor | None = None, rtol: float | None = None
) -> dict[str, Tensor]:
    """``collapse_metrics`` on the states as they are (no cross-process sync); ``compute()`` uses it."""
    rtol = rtol if rtol is not None else stats.rtol
    if rtol is None:
        rtol = stats.feature_dim * float(stats.feature_eps)
        if rtol >= 1:
            raise KdcollapseError(
                f"the default rtol = d * eps of the features' dtype = {rtol:.3g} would discard every "
                "eigenvalue (half-precision features?); pass rtol= explicitly or update with float32 features"
            )
    raw, unit = scatter(stats, unit=False), scatter(stats, unit=True)
    equinorm, equiangle = _equinorm_equiangle(raw.class_means - raw.global_mean)
    out = {**_variability(raw, rtol), **_cosine(unit.class_means), **_generalized(unit, rtol)}
    out |= {"nc2_equinorm": equinorm, "nc2_equiangle": equiangle}
    if classifier_weight is not None:
        expected = (stats.num_classes, stats.feature_dim)
        if not isinstance(classifier_weight, Tensor) or tuple(classifier_weight.shape) != expected:
            is_tensor = isinstance(classifier_weight, Tensor)
            shape = tuple(classifier_weight.shape) if is_tensor else "not a tensor"
            raise KdcollapseError(f"classifier_weight must be a (K, d) = {expected} tensor, got {shape}")
        weight = classifier_weight.detach().to(device=raw.total.device, dtype=torch.float64)
        if not bool(torch.isfinite(weight).all()):
            raise KdcollapseError("classifier_weight contains NaN or inf")
        out |= _classifier(raw, unit, weight)
    return out


def collapse_metrics(
    stats: FeatureStatistics, classifier_weight: Tensor | None = None, *, rtol: float | None = None
) -> dict[str, Tensor]:
    r"""Every collapse metric of the features summarised by ``stats`` (0-d float64 tensors; ranks int64).

    Gathers the states across processes first, like ``stats.compute()`` (all ranks must call it).

    Features h (class prior: see the module docstring):

    - ``nc1`` :math:`= \frac1K \mathrm{Tr}(\Sigma_W\Sigma_B^\dagger)`, ``fuzziness`` = K nc1
      (Papyan et al. 2020).
    - ``vci`` :math:`= 1 - \mathrm{Tr}(\Sigma_T^\dagger\Sigma_B)/\min(d, K-1)` (VCI paper Def. 5.3).
    - ``linear_probe_mse``: min over W, b of the least-squares probe loss (VCI paper Thm 5.1).
    - ``squared_distance`` :math:`= \mathrm{Tr}\,\Sigma_W / \mathrm{Tr}\,\Sigma_B`
      (Hui et al. 2022; VCI eq. 4).
    - ``cosine_within`` and ``class_separation`` (Kornblith et al. 2021).
    - ``nc2_equinorm``, ``nc2_equiangle`` of mu_k - mu_G (Papyan et al. 2020).
    - ``gnc1`` on L2-normalised features (GNC paper Sec. 2.2).
    - ``rank_between``, ``rank_total``, ``rank_between_unit``: ranks kept by the pseudo-inverses of Sigma_B,
      Sigma_T and the GNC Sigma_B; ``vci_rank`` = min(d, K-1).

    With ``classifier_weight`` W (K, d), e.g. ``model.head.weight``:

    - ``nc2_equinorm_w``, ``nc2_equiangle_w`` of the rows w_k;
      ``nc3`` :math:`= \lVert W/\lVert W\rVert_F - \tilde M/\lVert\tilde M\rVert_F\rVert_F^2`, rows of
      :math:`\tilde M` the mu_k - mu_G (Papyan et al. 2020).
    - ``gnc2`` :math:`= \min_k \mathrm{dist}(\hat w_k, \mathrm{conv}\{\hat w_j\}_{j\ne k})` of the unit rows
      (GNC Def. 2.1, a distance) and ``gnc2_optimum``, its maximum for (K, d) where known (nan otherwise).
    - ``gnc3`` :math:`= \frac1K\sum_k (1 - \hat w_k^\top \bar h_k)`, h_k the class means of unit features.

    ``rtol`` overrides the pseudo-inverse threshold (default ``d * eps`` of the features' dtype).
    """
    with stats.sync_context(dist_sync_fn=stats.dist_sync_fn, should_sync=stats.sync_on_compute):
        return metrics_from_statistics(stats, classifier_weight, rtol)
