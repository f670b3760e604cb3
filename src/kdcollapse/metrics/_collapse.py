r"""Collapse metrics (NC1-NC3, VCI, GNC1-GNC3, ...) as functions of ``FeatureStatistics`` states.

Conventions (docs/metrics.md, "Conventions"). Every covariance below is exact for the samples held; the
papers write them for balanced classes (n samples per class), and class imbalance forces a choice:

- VCI and the linear-probe MSE use the covariances of the sample, under the empirical class prior
  :math:`\pi_k = n_k/N`: :math:`\mu_G = \frac1N\sum_i h_i`, :math:`\Sigma_W = \frac1N \sum_i
  (h_i-\mu_{y_i})(\cdot)^\top`, :math:`\Sigma_B^\pi = \sum_k \pi_k (\mu_k-\mu_G)(\cdot)^\top` and
  :math:`\Sigma_T = \frac1N\sum_i (h_i-\mu_G)(\cdot)^\top = \Sigma_W + \Sigma_B^\pi`, on which VCI
  Thm 5.1, 5.2 and Cor. 5.4 rest.
- NC1, fuzziness, squared distance and GNC1 use :math:`\Sigma_W` (the average over samples, as Papyan
  et al.'s :math:`\mathrm{Ave}_{i,c}`) against a between-class covariance chosen by ``convention``:
  ``"papyan"`` (default) counts every class once, :math:`\Sigma_B = \frac1K\sum_k (\mu_k-\bar\mu)(\cdot)^\top`
  about the mean of the class means :math:`\bar\mu = \frac1K\sum_k\mu_k`; ``"prior"`` uses
  :math:`\Sigma_B^\pi`.
- The class-level metrics (NC2, NC3, cosine distances, GNC3) count each class once and centre on
  :math:`\bar\mu`, the centre of a simplex ETF, so perfectly collapsed features score 0 for any class sizes.

With balanced classes :math:`\bar\mu = \mu_G`, :math:`\Sigma_B = \Sigma_B^\pi` and both conventions are the
papers' definitions. ``linear_probe_mse`` is the exact minimum of :math:`\frac1{2N}\sum_i \lVert W h_i + b -
e_{y_i}\rVert^2` for any prior, :math:`\tfrac12\,[1 - \sum_k \pi_k^2 - \sum_k \pi_k^2 (\mu_k-\mu_G)^\top
\Sigma_T^\dagger (\mu_k-\mu_G)]` (VCI Thm 5.1 when :math:`\pi_k = 1/K`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry import min_one_vs_rest_distance, softmax_code_optimum
from kdcollapse.metrics._linalg import (
    LazyRows,
    cross_gram,
    per_row,
    pinv_from_eigh,
    psd_eigh,
    psd_pinv,
    quadratic_forms,
    row_dots,
    row_sum,
    symmetric_from_upper,
    weighted_sum,
)
from kdcollapse.metrics._pairwise import TILE, class_mean_kernels, equiangle, etf_error


class States(Protocol):
    """What the metrics read of a ``FeatureStatistics`` (``kdcollapse.metrics._statistics``, which implements
    this protocol and computes its metrics with this module): its options and its float64 states, the sums of
    the raw and of the L2-normalised features."""

    num_classes: int
    feature_dim: int
    rtol: float | None
    convention: str
    class_counts: Tensor
    shift: Tensor
    class_sums: Tensor
    class_square_sums: Tensor
    moment: Tensor
    unit_shift: Tensor
    unit_class_sums: Tensor
    unit_moment: Tensor


CONVENTIONS = ("papyan", "prior")
# GNC1 and GNC3: "paper" as the GNC paper writes them (uncentred Sigma_B, uncentred class means of unit
# features), "official" as the official GNC code computes them (GNC1.py, GNC3.py: centred on the global
# mean of the unit features). See ``_generalized`` and docs/metrics.md.
GNC_CONVENTIONS = ("paper", "official")
# Level of the test that counts GNC1's mean-of-class-means direction (see ``_generalized``): the chance of
# counting an offset that is pure sampling noise.
OFFSET_TEST_LEVEL = 1e-6
@dataclass(frozen=True)
class Scatter:
    """Class means and covariances of one feature map under the empirical class prior (float64). The two K x d
    matrices are ``LazyRows`` of the class sums (in their dtype): formed a chunk or a tile at a time, never
    held whole, so the metric phase keeps no K x d matrix beyond the states and W (docs/metrics.md)."""

    counts: Tensor  # (K,) n_k
    prior: Tensor  # (K,) pi_k = n_k / N
    class_means: LazyRows  # (K, d) mu_k
    centred: LazyRows  # (K, d) mu_k - mu_G, formed about the shift (no cancellation far from the origin)
    within: Tensor  # (d, d) Sigma_W
    between: Tensor  # (d, d) Sigma_B^pi
    total: Tensor  # (d, d) Sigma_T
    variances: Tensor | None  # (K,) (1/n_k) sum_{y_i = k} |h_i - mu_k|^2 (raw features only, for CDNV)


def scatter(stats: States, *, unit: bool) -> Scatter:
    """Means and covariances of the raw (``unit=False``) or L2-normalised features from the states."""
    counts = _checked_counts(stats)
    prefix = "unit_" if unit else ""
    shift, class_sums = getattr(stats, prefix + "shift"), getattr(stats, prefix + "class_sums")
    n = counts.to(torch.float64)
    prior = n / n.sum()
    work = class_sums.dtype  # float64, or float32 under float32 accumulation: the K x d matrices keep it
    scale = n.to(work)[:, None]
    means = LazyRows(class_sums.shape, work, class_sums.device,
                     lambda rows: class_sums[rows] / scale[rows])  # mu_k - shift
    mean = class_sums.sum(0, dtype=torch.float64) / n.sum()  # mu_G - shift
    centred = means.map(lambda rows: rows - mean.to(work))
    total = symmetric_from_upper(getattr(stats, prefix + "moment")) / n.sum() - torch.outer(mean, mean)
    between = cross_gram(centred, weights=prior)
    variances = None if unit else (stats.class_square_sums / n
                                   - per_row(means, lambda rows: rows.square().sum(1, dtype=torch.float64))
                                   ).clamp_min(0)
    class_means = means.map(lambda rows: rows + shift.to(work))
    return Scatter(n, prior, class_means, centred, total - between, between, total, variances)


def class_weights(sc: Scatter, convention: str) -> Tensor:
    """The weight of each class in Sigma_B: 1/K (``"papyan"``) or the class prior pi_k (``"prior"``)."""
    return sc.prior if convention == "prior" else torch.full_like(sc.prior, 1 / sc.prior.numel())


def between_class(sc: Scatter, convention: str) -> Tensor:
    """Sigma_B of the NC1 family: sum_k w_k (mu_k - m)(mu_k - m)^T about m = sum_k w_k mu_k (w_k above)."""
    weights = class_weights(sc, convention)
    centre = weighted_sum(sc.centred, weights).to(sc.centred.dtype)
    return cross_gram(sc.centred.map(lambda rows: rows - centre), weights=weights)


def class_centred(sc: Scatter) -> LazyRows:
    """mu_k minus the mean of the class means, the rows NC2 and NC3 compare with a simplex ETF."""
    centre = (row_sum(sc.centred) / sc.centred.shape[0]).to(sc.centred.dtype)
    return sc.centred.map(lambda rows: rows - centre)


def _checked_counts(stats: States) -> Tensor:
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


def _fuzziness(within: Tensor, spectrum: tuple[Tensor, Tensor], rtol: float | None) -> tuple[Tensor, int]:
    """Tr(Sigma_W Sigma_B^+) and the rank kept, from Sigma_B's ``psd_eigh``; nan when Sigma_B is 0 (every class
    mean at the centre)."""
    if rtol is None:  # psd_pinv's default for the float64 Sigma_B
        rtol = spectrum[0].numel() * torch.finfo(torch.float64).eps
    between_pinv, rank = pinv_from_eigh(*spectrum, rtol=rtol)
    if rank == 0:
        return torch.tensor(math.nan, dtype=torch.float64), 0
    return (within * between_pinv).sum(), rank  # both symmetric


def _truncated(within: Tensor, spectrum: tuple[Tensor, Tensor], rank: int) -> Tensor:
    """Tr(Sigma_W Sigma_B^+) with Sigma_B^+ from its ``rank`` largest eigenvalues only, whatever their size: NC1 "by
    SVD" (Han et al. 2022; rhubarbwu's ``covariance_ratio(metric="svd")``, its top K - 1 singular triplets); nan
    if one of them is not positive. ``spectrum`` is Sigma_B's ``psd_eigh``, shared with ``_fuzziness``."""
    eigenvalues, eigenvectors = spectrum
    values, vectors = eigenvalues[-rank:], eigenvectors[:, -rank:]
    if rank == 0 or bool((values <= 0).any()):
        return torch.tensor(math.nan, dtype=torch.float64)
    return ((vectors.mT @ within @ vectors).diagonal() / values).sum()


def _variability(raw: Scatter, rtol: float | None, convention: str) -> dict[str, Tensor]:
    """NC1 / fuzziness (Papyan et al. 2020) by pseudo-inverse and by truncated SVD (Han et al. 2022), VCI and the
    linear-probe MSE (VCI paper Def. 5.3, Thm 5.1), squared distance (Hui et al. 2022, VCI paper eq. 4; NC1 "by
    quotient", Tirer et al. 2023)."""
    num_classes, dim = raw.prior.numel(), raw.total.shape[0]
    between = between_class(raw, convention)
    spectrum = psd_eigh(between)  # one eigendecomposition of Sigma_B for NC1 and NC1 by SVD
    fuzziness, rank_between = _fuzziness(raw.within, spectrum, rtol)
    svd = _truncated(raw.within, spectrum, min(num_classes - 1, dim)) / num_classes
    total_pinv, rank_total = psd_pinv(raw.total, rtol=rtol)
    explained = quadratic_forms(raw.centred, total_pinv)  # (mu_k - mu_G)^T S_T^+ (mu_k - mu_G)
    vci_rank = min(dim, num_classes - 1)  # rank(Sigma_B) as the VCI paper takes it (Sec. 5)
    return {
        "nc1": fuzziness / num_classes,
        "fuzziness": fuzziness,
        "nc1_svd": svd,
        "vci": 1 - (raw.prior * explained).sum() / vci_rank,  # Tr(S_T^+ S_B^pi) = sum_k pi_k explained_k
        "linear_probe_mse": 0.5 * (1 - raw.prior.square().sum() - (raw.prior.square() * explained).sum()),
        "squared_distance": raw.within.trace() / between.trace(),
        "rank_between": torch.tensor(rank_between),
        "rank_total": torch.tensor(rank_total),
        "vci_rank": torch.tensor(vci_rank),
    }


def _cosine(unit_means: LazyRows) -> dict[str, Tensor]:
    r"""Kornblith et al. 2021 (VCI paper Sec. 3.2), from the class means :math:`\bar u_k` of unit features:
    :math:`\bar d_{within} = \frac1K\sum_k (1 - \lVert\bar u_k\rVert^2)` (the mean of 1 - cos over all
    within-class pairs), :math:`\bar d_{total} = 1 - \lVert\frac1K\sum_k \bar u_k\rVert^2`."""
    within = (1 - per_row(unit_means, lambda rows: rows.square().sum(1, dtype=torch.float64))).mean()
    total = 1 - (row_sum(unit_means) / unit_means.shape[0]).square().sum()
    return {"cosine_within": within, "class_separation": 1 - within / total}


def _equinorm(vectors: Tensor | LazyRows) -> Tensor:
    """NC2's equinorm (Papyan et al. 2020): the coefficient of variation of the norms of the rows of
    ``vectors`` (K, d) (std with Bessel's correction, as ``torch.std``); its equiangularity, the mean over
    k != k' of ``|cos(v_k, v_k') + 1/(K-1)|``, runs in tiles (``kdcollapse.metrics._pairwise``)."""
    norms = per_row(vectors, lambda rows: rows.norm(dim=1).double())
    return norms.std() / norms.mean()


def _generalized(unit: Scatter, rtol: float | None, convention: str, gnc_convention: str) -> dict[str, Tensor]:
    r"""GNC1 (GNC paper Sec. 2.2) on unit features, with the paper's uncentred Sigma_B, except for the one
    direction it adds that sampling noise explains.

    With :math:`\bar h = \sum_k w_k \bar h_k` (w_k from ``class_weights``), the paper's
    :math:`\sum_k w_k \bar h_k \bar h_k^\top = \Sigma_B^c + \bar h \bar h^\top`, :math:`\Sigma_B^c` centred
    on :math:`\bar h`. Its range exceeds that of :math:`\Sigma_B^c` only by :math:`r`, the part of
    :math:`\bar h` outside it. When the class means sum to zero (a simplex ETF), the population r is 0 and
    the sample's r is the class means' sampling noise; inverting it would divide Sigma_W by its own noise
    and make GNC1 jump from 0 to O(n) at any noise. So r is counted only when a Hotelling test rejects
    "r is noise" at level ``OFFSET_TEST_LEVEL`` (``_offset_is_noise``); otherwise Sigma_B uses
    :math:`\bar h - r`. Where the class means' offset is real (e.g. non-negative ReLU features) or
    :math:`\Sigma_B^c` has full rank (K > d), this is the paper's matrix exactly.
    """
    if gnc_convention == "official":
        return _generalized_official(unit, rtol)
    weights = class_weights(unit, convention)
    offset = weighted_sum(unit.class_means, weights)
    work_offset = offset.to(unit.class_means.dtype)
    centred_between = cross_gram(unit.class_means.map(lambda rows: rows - work_offset), weights=weights)
    pinv, _ = psd_pinv(centred_between, rtol=rtol)
    outside_range = torch.eye(offset.numel(), dtype=offset.dtype, device=offset.device) - pinv @ centred_between
    outside = outside_range @ offset
    if _offset_is_noise(outside, outside_range, unit, weights, rtol):
        offset = offset - outside
    fuzziness, rank = _fuzziness(unit.within, psd_eigh(centred_between + torch.outer(offset, offset)), rtol)
    return {"gnc1": fuzziness / unit.prior.numel(), "rank_between_unit": torch.tensor(rank)}


def _generalized_official(unit: Scatter, rtol: float | None) -> dict[str, Tensor]:
    r"""GNC1 as the official GNC code computes it (``GNC1.py``): Sigma_W of the unit features against
    :math:`\frac1K\sum_k (\bar h_k - \mu_G)(\cdot)^\top`, centred on the global mean :math:`\mu_G` of the
    unit features (sample-weighted), every class counted once. Centred, its rank is at most K - 1 and no
    offset direction arises, so it is continuous in the features (docs/metrics.md)."""
    num_classes = unit.prior.numel()
    fuzziness, rank = _fuzziness(unit.within, psd_eigh(cross_gram(unit.centred) / num_classes), rtol)
    return {"gnc1": fuzziness / num_classes, "rank_between_unit": torch.tensor(rank)}


def _offset_is_noise(outside: Tensor, projector: Tensor, unit: Scatter, weights: Tensor, rtol) -> bool:
    """Whether Hotelling's T^2 test keeps "``outside`` is the sampling noise of sum_k w_k mean_k" at level
    ``OFFSET_TEST_LEVEL``, on the subspace ``projector`` maps onto, with the pooled within-class covariance
    (Cov(sum_k w_k mean_k) = sum_k w_k^2 / n_k * Sigma, Sigma estimated with N - K degrees of freedom)."""
    from scipy.special import fdtrc  # the F distribution's survival function; import on use

    samples, num_classes = float(unit.counts.sum()), unit.counts.numel()
    dof = samples - num_classes
    scale = float((weights.square() / unit.counts).sum()) * samples / max(dof, 1.0)
    noise_pinv, rank = psd_pinv(scale * projector @ unit.within @ projector.mT, rtol=rtol)
    if rank == 0 or dof - rank + 1 <= 0:
        return False  # no noise to explain it, or too few samples to tell: keep the paper's matrix
    t_squared = float(outside @ noise_pinv @ outside)
    f_statistic = t_squared * (dof - rank + 1) / (dof * rank)
    return float(fdtrc(rank, dof - rank + 1, f_statistic)) > OFFSET_TEST_LEVEL


def _classifier(centred: LazyRows, gram: Tensor, unit: Scatter, weight: Tensor, gnc_convention: str,
                tile: int) -> dict[str, Tensor]:
    """Metrics of the classifier rows w_k: NC2 on W, NC3 (Papyan et al. 2020; Kothapalli's self-duality
    error), GNC2 and GNC3 (GNC paper; GNC3 of the centred unit class means under ``"official"``);
    ``centred`` is ``class_centred`` of the raw features' scatter, ``gram`` its ``cross_gram``. No K x d copy
    of W or of the means: the normalised and scaled rows are formed a chunk at a time (``LazyRows``).

    A zero row w_k is a real classifier row (class k's logit is 0 for every input: Hugging Face zeroes the
    padding token's embedding row of a fresh model, and a tied head inherits it) but has no direction. The
    metrics of row directions, ``nc2_equiangle_w``, ``gnc2`` (and ``gnc2_optimum``), ``gnc3`` and
    ``unc3_cosine``, are therefore taken over the nonzero rows only (NaN when fewer than two are left); those of
    magnitudes (``nc2_equinorm_w``, ``nc3``, ``nc3_self_duality``, ``unc3``) over every row, a zero row
    included; ``classifier_zero_rows`` counts the rows left out."""
    keep = per_row(LazyRows.of(weight), lambda rows: (rows != 0).any(1))
    zero_rows = int((~keep).sum())
    directed = weight if not zero_rows else weight[keep]  # a copy only when a row is zero
    optimum = softmax_code_optimum(*directed.shape) if len(directed) >= 2 else None

    rows_w = LazyRows.of(weight)
    unit_weight = rows_w.map(lambda rows: F.normalize(rows, dim=1))
    equinorm = _equinorm(weight)
    nan = torch.tensor(math.nan, dtype=torch.float64, device=weight.device)
    equiangle_w = equiangle(directed, tile) if len(directed) >= 2 else nan
    normalised = unit.centred.map(lambda rows: F.normalize(rows, dim=1))
    unit_means = normalised if gnc_convention == "official" else unit.class_means
    weight_norm = weight.norm()
    centred_norm = per_row(centred, lambda rows: rows.square().sum(1, dtype=torch.float64)).sum().sqrt()
    centred_norm = centred_norm.to(centred.dtype)
    difference = rows_w.map(lambda rows: rows / weight_norm)
    nc3 = sum(((difference[rows] - chunk / centred_norm).square().sum(dtype=torch.float64)
               for rows, chunk in centred.chunks()), torch.zeros((), dtype=torch.float64, device=weight.device))
    similarity = row_dots(rows_w, centred)  # w_k . (mu_k - mu_bar): rhubarbwu's similarities(W, M, m_G)
    cosine = similarity / (per_row(rows_w, lambda rows: rows.norm(dim=1).double())
                           * per_row(centred, lambda rows: rows.norm(dim=1).double())).clamp_min(1e-300)
    return {
        "unc3": similarity.var(),
        "unc3_cosine": cosine[keep].var() if zero_rows else cosine.var(),
        "nc2_equinorm_w": equinorm,
        "nc2_equiangle_w": equiangle_w,
        "nc3": nc3,
        "nc3_self_duality": etf_error(centred, weight, gram),
        # W in its dtype: no K x d float64 copy
        "gnc2": min_one_vs_rest_distance(directed).value if len(directed) >= 2 else nan,
        "gnc2_optimum": torch.tensor(math.nan if optimum is None else optimum, dtype=torch.float64),
        "gnc3": ((1 - row_dots(unit_weight, unit_means))[keep] if zero_rows else
                 1 - row_dots(unit_weight, unit_means)).mean(),
        "classifier_zero_rows": torch.tensor(zero_rows),
    }


def ood_deviation(class_means: Tensor | LazyRows, ood_mean: Tensor) -> Tensor:
    r"""NC5, out-of-distribution orthogonality (Ammar et al., NECO, ICLR 2024):
    :math:`\frac1K\sum_k |\cos(\mu_k, \mu_G^{ood})|`, the (uncentred) class means against the mean of the OOD
    features, as rhubarbwu's ``orthogonality_deviation(M, m_G_ood)``; 0 = every class mean orthogonal to it."""
    if not isinstance(ood_mean, Tensor) or ood_mean.ndim != 1 or ood_mean.numel() != class_means.shape[1]:
        shape = tuple(ood_mean.shape) if isinstance(ood_mean, Tensor) else type(ood_mean).__name__
        raise KdcollapseError(f"ood_mean must be a ({class_means.shape[1]},) tensor, got {shape}")
    if not bool(torch.isfinite(ood_mean).all()):
        raise KdcollapseError("ood_mean contains NaN or inf")
    direction = F.normalize(ood_mean.to(device=class_means.device, dtype=torch.float64), dim=0)
    rows = LazyRows.of(class_means)
    dots = per_row(rows, lambda chunk: chunk.double() @ direction)
    norms = per_row(rows, lambda chunk: chunk.double().norm(dim=1)).clamp_min(1e-300)
    return (dots / norms).abs().mean()


def check_convention(convention: str) -> str:
    """``convention`` if it is one of ``CONVENTIONS``, else a ``KdcollapseError`` naming the choices."""
    if convention not in CONVENTIONS:
        raise KdcollapseError(f"unknown convention {convention!r}; choose one of {', '.join(CONVENTIONS)}")
    return convention


def check_gnc_convention(gnc_convention: str) -> str:
    """``gnc_convention`` if it is one of ``GNC_CONVENTIONS``, else a ``KdcollapseError`` naming the choices."""
    if gnc_convention not in GNC_CONVENTIONS:
        raise KdcollapseError(
            f"unknown gnc_convention {gnc_convention!r}; choose one of {', '.join(GNC_CONVENTIONS)}"
        )
    return gnc_convention


def metrics_from_statistics(
    stats: States,
    classifier_weight: Tensor | None = None,
    rtol: float | None = None,
    convention: str | None = None,
    gnc_convention: str | None = None,
    tile: int = TILE,
    ood_mean: Tensor | None = None,
) -> dict[str, Tensor]:
    """``collapse_metrics`` on the states as they are (no cross-process sync); ``compute()`` uses it."""
    rtol = rtol if rtol is not None else stats.rtol  # None: d * eps(float64), the states' dtype
    convention = check_convention(convention if convention is not None else stats.convention)
    gnc_convention = check_gnc_convention(
        gnc_convention if gnc_convention is not None else getattr(stats, "gnc_convention", "paper")
    )
    raw, unit = scatter(stats, unit=False), scatter(stats, unit=True)
    centred = class_centred(raw)
    pairwise = class_mean_kernels(centred, raw.variances, tile)  # one pass over the means' Gram tiles
    out = {**_variability(raw, rtol, convention), **_cosine(unit.class_means),
           **_generalized(unit, rtol, convention, gnc_convention)}
    gram = cross_gram(centred)  # M~^T M~ (d x d): NC2's and NC3's ETF errors
    out |= {"nc2_equinorm": _equinorm(centred), "nc2_equiangle": pairwise.pop("nc2_equiangle"),
            "nc2_etf_error": etf_error(centred, gram=gram), "cdnv": pairwise.pop("cdnv"), **pairwise}
    if ood_mean is not None:
        out["nc5_ood_deviation"] = ood_deviation(raw.class_means, ood_mean)
    if classifier_weight is not None:
        expected = (stats.num_classes, stats.feature_dim)
        if not isinstance(classifier_weight, Tensor) or tuple(classifier_weight.shape) != expected:
            is_tensor = isinstance(classifier_weight, Tensor)
            shape = tuple(classifier_weight.shape) if is_tensor else "not a tensor"
            raise KdcollapseError(f"classifier_weight must be a (K, d) = {expected} tensor, got {shape}")
        weight = classifier_weight.detach().to(device=raw.total.device, dtype=raw.centred.dtype)
        if not bool(torch.isfinite(torch.stack(torch.aminmax(weight))).all()):  # NaN propagates; no K x d mask
            raise KdcollapseError("classifier_weight contains NaN or inf")
        out |= _classifier(centred, gram, unit, weight, gnc_convention, tile)
    return out
