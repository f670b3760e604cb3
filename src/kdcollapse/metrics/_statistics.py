"""``FeatureStatistics``: one-pass, mergeable sufficient statistics of (feature, label) pairs."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics._collapse import (
    States,
    check_convention,
    check_gnc_convention,
    metrics_from_statistics,
    scatter,
)
from kdcollapse.metrics._metric import Metric, gather_all_tensors
from kdcollapse.metrics._pairwise import TILE

# (shift, class sums, second moment) of the raw features and of the L2-normalised ("unit") features.
_GROUPS = (("shift", "class_sums", "moment"), ("unit_shift", "unit_class_sums", "unit_moment"))

ACCUMULATIONS = ("float64", "float32", "auto")
# accumulate="auto": float32 class sums once the two float64 K x d class sums (16 K d bytes) would exceed this
# (4 GiB: K = 49,152 at d = 4,096 still fits, 3.2 GB; K = 128,256 at d = 4,096 does not, 8.4 GB).
ACCUMULATION_BOUND = 4 * 2**30


def accumulation_dtype(num_classes: int, feature_dim: int, accumulate: str = "float64",
                       bound: int = ACCUMULATION_BOUND) -> torch.dtype:
    """The dtype of ``FeatureStatistics``' K x d class sums: ``accumulate`` itself, or for ``"auto"`` float64
    while the two float64 K x d class sums take at most ``bound`` bytes, float32 beyond."""
    if accumulate not in ACCUMULATIONS:
        raise KdcollapseError(f"unknown accumulate {accumulate!r}; choose one of {', '.join(ACCUMULATIONS)}")
    if accumulate == "auto":
        return torch.float32 if 2 * num_classes * feature_dim * 8 > bound else torch.float64
    return torch.float32 if accumulate == "float32" else torch.float64


def check_batch(features: Tensor, labels: Tensor, num_classes: int, feature_dim: int | None) -> None:
    """Raise a ``KdcollapseError`` unless ``features`` is a finite ``(B, feature_dim)`` float tensor and
    ``labels`` a ``(B,)`` integer tensor of class indices in ``[0, num_classes)``."""
    if not isinstance(features, Tensor) or not isinstance(labels, Tensor):
        kinds = f"{type(features).__name__} and {type(labels).__name__}"
        raise KdcollapseError(f"features and labels must be torch tensors, got {kinds}")
    expected = f"(B, {feature_dim})" if feature_dim is not None else "(B, d)"
    if features.ndim != 2 or (feature_dim is not None and features.shape[1] != feature_dim):
        raise KdcollapseError(f"features must have shape {expected}, got {tuple(features.shape)}")
    if not features.is_floating_point():
        raise KdcollapseError(f"features must be a floating-point tensor, got dtype {features.dtype}")
    if labels.ndim != 1 or labels.shape[0] != features.shape[0]:
        raise KdcollapseError(
            f"labels must have shape ({features.shape[0]},) to match features {tuple(features.shape)}, "
            f"got {tuple(labels.shape)}"
        )
    if labels.is_floating_point() or labels.is_complex() or labels.dtype == torch.bool:
        raise KdcollapseError(f"labels must be integer class indices, got dtype {labels.dtype}")
    if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        bad = labels[(labels < 0) | (labels >= num_classes)].unique()[:5].tolist()
        raise KdcollapseError(f"labels {bad} are out of range; valid class indices are 0..{num_classes - 1}")
    # min and max propagate NaN and reach +-inf: one cheap pass, the row-wise check only on failure.
    if features.numel() and not bool(torch.isfinite(torch.stack(torch.aminmax(features))).all()):
        rows = (~torch.isfinite(features).all(dim=1)).nonzero().flatten()
        raise KdcollapseError(
            f"features contain NaN or inf in {rows.numel()} of {features.shape[0]} rows "
            f"(first: row {int(rows[0])})"
        )


def _agreed(stacked: Tensor) -> Tensor:
    """Reduction of a shift across processes: ``sync`` has made it identical on every rank."""
    return stacked[0]


def _add_gram(moment: Tensor, z: Tensor) -> None:
    """``moment += z.T @ z`` for ``z`` of shape ``(B, d)``; only the upper triangle of ``moment`` is kept.

    On CPU, BLAS ``dsyrk`` computes just that triangle, half the flops of a matmul
    (``benchmarks/bench_metrics.py`` measures it); elsewhere a full ``addmm_``.
    """
    if moment.device.type == "cpu" and moment.is_contiguous():
        from scipy.linalg import blas  # on use: scipy.linalg costs a third of `import torch` (issue 42)

        # moment.T is a Fortran-ordered view, so dsyrk updates it in place; its lower = our upper.
        blas.dsyrk(1.0, z.numpy().T, beta=1.0, c=moment.numpy().T, lower=1, overwrite_c=1)
    else:
        moment.addmm_(z.mT, z)


class _BatchSums:
    """Where ``update`` adds a batch's rows to a K x d class-sum state, block by block.

    Float64 sums take each block's rows directly (``class_sums[labels] += z``, row by row, in order). Float32
    sums get each class's batch sum formed in float64 over all blocks first and rounded into the state once
    (``close``), so the rounding error grows with batches, not samples or blocks.
    """

    def __init__(self, class_sums: Tensor, labels: Tensor) -> None:
        self.state = class_sums
        if class_sums.dtype == torch.float64:
            self.target, self.index, self.present = class_sums, labels, None
        else:
            self.present, self.index = labels.unique(return_inverse=True)
            self.target = class_sums.new_zeros(self.present.numel(), class_sums.shape[1], dtype=torch.float64)

    def add(self, rows: slice, z: Tensor) -> None:
        """Add ``z``, the float64 rows ``rows`` of the batch."""
        self.target.index_add_(0, self.index[rows], z)

    def close(self) -> None:
        if self.present is not None:
            self.state.index_add_(0, self.present, self.target.to(self.state.dtype))


# update works through a batch in blocks of rows of about BLOCK_ELEMENTS elements, and at least MIN_BLOCK_ROWS
# rows: each block's float64 copies (the widened features, the centred raw and unit rows) stay in the core's
# cache from one step to the next (float64 copy, norms, centring, squares, class sums, both Grams) instead of
# every step streaming the whole batch through memory. A BLAS rank-k Gram update reads and writes the d x d
# triangle once per call, which costs little against its 2 k d^2 flops only from about k = 256 rows on. CPU
# only (on a GPU the batch is one block). results/benchmarks/bench_metrics.md measures it.
BLOCK_ELEMENTS = 2**17
MIN_BLOCK_ROWS = 256


def _block_rows(features: Tensor, device: torch.device) -> int:
    """Rows per block of ``update`` (``BLOCK_ELEMENTS``, ``MIN_BLOCK_ROWS``)."""
    rows = features.shape[0]
    if device.type != "cpu":
        return rows
    return max(1, min(rows, max(MIN_BLOCK_ROWS, BLOCK_ELEMENTS // features.shape[1])))


def _recentred_squares(counts: Tensor, shift: Tensor, class_sums: Tensor, squares: Tensor, new_shift: Tensor):
    """Per-class sums of |h - new_shift|^2 from those about ``shift``: squares - 2 S_k.delta + n_k |delta|^2."""
    delta = (new_shift - shift).to(squares)
    dots = (class_sums @ delta.to(class_sums.dtype)).to(squares)
    return squares - 2 * dots + counts.to(squares) * delta.square().sum()


def _recentred(counts: Tensor, shift: Tensor, class_sums: Tensor, moment: Tensor, new_shift: Tensor):
    """Class sums and second moment of the same samples about ``new_shift`` instead of ``shift``.

    With delta = new_shift - shift and S = sum_k class_sums_k:
    sum (h - new)(h - new)^T = moment - S delta^T - delta S^T + N delta delta^T. Exact algebra; the shifts
    being nearby first-batch means keeps every term at the scale of the data's spread.
    """
    delta = (new_shift - shift).to(moment)
    n = counts.to(moment)
    total = class_sums.sum(0, dtype=moment.dtype)
    correction = n.sum() * torch.outer(delta, delta) - torch.outer(total, delta) - torch.outer(delta, total)
    return class_sums - n.to(class_sums)[:, None] * delta.to(class_sums), moment + correction


class FeatureStatistics(Metric, States):
    r"""Sufficient statistics of penultimate features for every collapse metric, in one streaming pass.

    States (float64; memory ``O(K d + d^2)``, independent of the number of samples N), each summed over
    batches and processes: per-class counts ``n_k``; per-class sums of ``h - c`` and of ``|h - c|^2`` (the
    latter for CDNV's per-class variances); the second moment
    :math:`\sum_i (h_i - c)(h_i - c)^\top`; and the same sums and moment for the L2-normalised features
    :math:`\hat h_i = h_i/\lVert h_i\rVert` about their own shift (zero vectors stay zero, as in
    ``torch.nn.functional.normalize``). The shift ``c`` is the first batch's mean: moments
    about a point inside the data do not cancel catastrophically. Features at 1e8 from the origin with unit
    spread still give every metric to 1e-6 relative; moments about the origin would give VCI = -0.25 for
    a true 0.002 (``tests/test_metrics.py``).

    Merging with different shifts is exact: two processes (or two halves) generally see different first
    batches. ``merge_state`` re-centres the incoming sums and moment on this object's shift before adding
    them, and under ``torch.distributed`` ``sync`` first gathers every rank's shift, re-centres each rank
    on the shift of the lowest rank holding data, and only then lets torchmetrics sum the states
    (``dist_reduce_fx="sum"``). Re-centring is exact algebra (``moment - S d^T - d S^T + N d d^T``) whose
    terms stay at the scale of the data because the shifts are nearby means; no rank has to wait for
    another during ``update``. Only the upper triangle of each moment is stored (see ``_add_gram``). On CPU,
    ``update`` works in cache-sized blocks of rows (``BLOCK_ELEMENTS``), the Grams included; every value is
    the one a float64 copy of the batch would give.

    ``compute()`` returns :func:`~kdcollapse.metrics.collapse_metrics` without a classifier; call
    ``collapse_metrics(stats, classifier_weight)`` for the classifier metrics (NC3, GNC2, GNC3). Every
    class must have at least one sample by then, and ``num_classes >= 2``. ``forward`` evaluates the batch
    alone (all classes must occur in it); accumulate with ``update``.

    Args:
        num_classes: K.
        feature_dim: d.
        rtol: eigenvalues at or below ``rtol * lambda_max`` are dropped in every pseudo-inverse; default
            ``d * eps`` of float64, the dtype of the states: bf16, fp16 and float32 features are widened
            to float64 before any arithmetic, so their metrics are those of the same values in float64.
        convention: ``"papyan"`` (default) or ``"prior"``, the Sigma_B of NC1, fuzziness, squared distance
            and GNC1 (module docstring of ``kdcollapse.metrics._collapse``; docs/metrics.md).
        gnc_convention: ``"paper"`` (default: GNC1 and GNC3 as the GNC paper writes them) or
            ``"official"`` (centred on the global mean of the unit features, as the official GNC code).
        accumulate: dtype of the two K x d class sums, the only states that grow with K: ``"float64"``
            (default), ``"float32"`` (half the memory; each batch's sums are formed in float64 and rounded
            once into the state, the d x d moments, counts and per-class squares stay float64, and the
            metric phase keeps its K x d matrices and pairwise tiles in float32 with float64 sums; tested
            against float64 to 1e-4 relative, docs/metrics.md), or ``"auto"`` (float32 only when float64
            would exceed ``ACCUMULATION_BOUND`` = 4 GiB, ``accumulation_dtype``).
        kwargs: passed to :class:`kdcollapse.metrics.Metric` (``process_group``, ``sync_on_compute``, ...).

    >>> stats = FeatureStatistics(num_classes=3, feature_dim=2)
    >>> features = torch.tensor([[1.0, 0.0], [1.2, 0.0], [0.0, 1.0], [-1.0, -1.0]])
    >>> stats.update(features, torch.tensor([0, 0, 1, 2]))
    >>> stats.class_counts.tolist()
    [2, 1, 1]
    >>> round(float(stats.compute()["nc1"]), 6)
    0.00293
    """

    is_differentiable = False
    higher_is_better = None
    # forward() must not merge a batch's state by plain summation (its shift differs): update twice.
    full_state_update = True

    def __init__(
        self,
        num_classes: int,
        feature_dim: int,
        *,
        rtol: float | None = None,
        convention: str = "papyan",
        gnc_convention: str = "paper",
        accumulate: str = "float64",
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if not isinstance(num_classes, int) or num_classes < 2:
            raise KdcollapseError(f"collapse metrics need num_classes >= 2, got {num_classes!r}")
        if not isinstance(feature_dim, int) or feature_dim < 1:
            raise KdcollapseError(f"feature_dim must be a positive integer, got {feature_dim!r}")
        if rtol is not None and not 0.0 <= rtol < 1.0:
            raise KdcollapseError(f"rtol must lie in [0, 1), got {rtol}")
        self.num_classes, self.feature_dim, self.rtol = num_classes, feature_dim, rtol
        self.convention = check_convention(convention)
        self.gnc_convention = check_gnc_convention(gnc_convention)
        k, d, f64 = num_classes, feature_dim, torch.float64
        sums = accumulation_dtype(k, d, accumulate)
        self.accumulate = "float32" if sums == torch.float32 else "float64"
        self.add_state("class_counts", torch.zeros(k, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("shift", torch.zeros(d, dtype=f64), dist_reduce_fx=_agreed)
        self._add_sums("class_sums", sums)
        self.add_state("class_square_sums", torch.zeros(k, dtype=f64), dist_reduce_fx="sum")
        self.add_state("moment", torch.zeros(d, d, dtype=f64), dist_reduce_fx="sum")
        self.add_state("unit_shift", torch.zeros(d, dtype=f64), dist_reduce_fx=_agreed)
        self._add_sums("unit_class_sums", sums)
        self.add_state("unit_moment", torch.zeros(d, d, dtype=f64), dist_reduce_fx="sum")
        self._lean_defaults()

    def _add_sums(self, name: str, dtype: torch.dtype) -> None:
        """A K x d class-sum state without a K x d default: ``add_state`` copies its default for ``reset()``, so
        it gets an empty one and ``_lean_defaults`` sets it; constructing costs the K x d zeros alone."""
        self.add_state(name, torch.zeros(0, self.feature_dim, dtype=dtype), dist_reduce_fx="sum")
        setattr(self, name, torch.zeros(self.num_classes, self.feature_dim, dtype=dtype))

    def _lean_defaults(self) -> None:
        """torchmetrics keeps a copy of each state's initial value for ``reset()``; for the two K x d sums, a
        zero-stride view of one zero instead of K x d zeros (``reset()`` clones it into a full tensor), so the
        states take 2 K x d, not 4."""
        for name in ("class_sums", "unit_class_sums"):
            default = self._defaults[name]
            self._defaults[name] = default.new_zeros(()).expand(self.num_classes, self.feature_dim)

    def update(self, features: Tensor, labels: Tensor) -> None:
        """Add a batch: ``features`` ``(B, d)`` (any float dtype), ``labels`` ``(B,)`` in ``[0, K)``."""
        check_batch(features, labels, self.num_classes, self.feature_dim)
        if features.shape[0] == 0:
            return
        device = self.moment.device
        features, labels = features.detach().to(device), labels.to(device)
        if int(self.class_counts.sum()) == 0:
            x = features.to(torch.float64)
            self.shift, self.unit_shift = x.mean(0), F.normalize(x, dim=1).mean(0)
        self.class_counts += torch.bincount(labels, minlength=self.num_classes)
        # Every value is float64 from here on, as one float64 copy of the batch would be, formed a block of rows
        # at a time (BLOCK_ELEMENTS).
        sums = _BatchSums(self.class_sums, labels), _BatchSums(self.unit_class_sums, labels)
        step = _block_rows(features, device)
        for start in range(0, features.shape[0], step):
            rows = slice(start, start + step)
            x = features[rows].to(torch.float64)  # never written to: it may be the caller's own tensor
            # unit features as F.normalize(x, dim=1) forms them: x / max(|x|, 1e-12), zero rows stay zero
            norms = torch.linalg.vector_norm(x, dim=1, keepdim=True).clamp_min_(1e-12)
            unit = torch.div(x, norms).sub_(self.unit_shift)
            raw = torch.sub(x, self.shift)
            self.class_square_sums.index_add_(0, labels[rows], raw.square().sum(1))
            sums[0].add(rows, raw)
            sums[1].add(rows, unit)
            _add_gram(self.moment, raw)
            _add_gram(self.unit_moment, unit)
        for batch in sums:
            batch.close()

    def _apply(self, fn: Any, exclude_state: Any = "") -> FeatureStatistics:
        """Move the states with the module (``.to(device)``, ``.cuda()``) but keep their dtypes whatever
        ``.to(dtype)``, ``.half()`` or ``set_dtype`` ask: half-precision sums of squares lose the metrics."""

        def move(tensor: Tensor) -> Tensor:
            return tensor.to(fn(tensor.new_empty(0)).device)

        out = super()._apply(move, exclude_state)
        self._lean_defaults()
        return out

    def compute(self) -> dict[str, Tensor]:
        """The collapse metrics without a classifier; see :func:`~kdcollapse.metrics.collapse_metrics`."""
        return metrics_from_statistics(self)

    def class_means(self) -> Tensor:
        """The ``(K, d)`` float64 class means mu_k, gathered across processes (for the NC4 second pass)."""
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self.sync_on_compute):
            return scatter(self, unit=False).class_means.full()

    def merge_state(self, incoming_state: dict[str, Tensor] | Metric) -> None:
        """Add another ``FeatureStatistics`` (or its ``metric_state`` dict) to this one, exactly, by first
        re-centring the incoming sums and moments on this object's shifts."""
        if isinstance(incoming_state, FeatureStatistics):
            other = incoming_state.metric_state
        elif isinstance(incoming_state, dict):
            other = incoming_state
        else:
            kind = type(incoming_state).__name__
            raise KdcollapseError(f"merge_state takes a FeatureStatistics or its metric_state, not {kind}")
        missing = sorted(set(self._defaults) - set(other))
        if missing:
            raise KdcollapseError(f"cannot merge: the incoming state lacks {missing}")
        if other["class_sums"].shape != self.class_sums.shape:
            raise KdcollapseError(
                f"cannot merge statistics of (K, d) = {tuple(other['class_sums'].shape)} into "
                f"{tuple(self.class_sums.shape)}"
            )
        if int(other["class_counts"].sum()) == 0:
            return
        if int(self.class_counts.sum()) == 0:
            self.shift, self.unit_shift = other["shift"].clone(), other["unit_shift"].clone()
        self.class_square_sums = self.class_square_sums + _recentred_squares(
            other["class_counts"], other["shift"], other["class_sums"], other["class_square_sums"], self.shift
        )
        for shift, class_sums, moment in _GROUPS:
            sums, second = _recentred(
                other["class_counts"], other[shift], other[class_sums], other[moment], getattr(self, shift)
            )
            setattr(self, class_sums, getattr(self, class_sums) + sums.to(getattr(self, class_sums).dtype))
            setattr(self, moment, getattr(self, moment) + second)
        self.class_counts = self.class_counts + other["class_counts"]
        self._computed = None  # torchmetrics' cached compute() result is stale now

    def sync(
        self,
        dist_sync_fn: Any = None,
        process_group: Any = None,
        should_sync: bool = True,
        distributed_available: Any = None,
    ) -> None:
        """Re-centre every rank on one shared shift, then sync (sum) the states as torchmetrics does."""
        available = distributed_available or self.distributed_available_fn
        if should_sync and callable(available) and available():
            gather = dist_sync_fn or gather_all_tensors
            group = process_group or self.process_group
            shifts = gather(torch.stack([self.shift, self.unit_shift]), group=group)
            totals = gather(self.class_counts.sum(), group=group)
            reference = next((s for s, n in zip(shifts, totals) if int(n) > 0), shifts[0])
            self.class_square_sums = _recentred_squares(
                self.class_counts, self.shift, self.class_sums, self.class_square_sums, reference[0]
            )
            for new_shift, (shift, class_sums, moment) in zip(reference, _GROUPS):
                old = getattr(self, shift), getattr(self, class_sums), getattr(self, moment)
                sums, second = _recentred(self.class_counts, *old, new_shift)
                setattr(self, shift, new_shift.clone())
                setattr(self, class_sums, sums)
                setattr(self, moment, second)
        super().sync(dist_sync_fn, process_group, should_sync, distributed_available)


def covariance_spectra(stats: FeatureStatistics) -> dict[str, Tensor]:
    """Eigenvalues, largest first, of Sigma_W, Sigma_B and Sigma_T of the raw features (float64, ``(d,)``
    each; keys ``within``, ``between``, ``total``), gathered across processes like ``compute()``.

    The VCI paper (Sec. 4.3, Fig. 2) plots the Sigma_B and Sigma_T spectra to show why Tr(Sigma_T^+ Sigma_B)
    is stable where Tr(Sigma_W Sigma_B^+) is not: Sigma_B has at most K - 1 non-zero eigenvalues and
    rounding fills the rest with tiny ones, while Sigma_T's spectrum is larger and flatter. Sigma_B here is
    the one VCI uses, the sample's Sigma_B^pi = Sigma_T - Sigma_W (``kdcollapse.metrics._collapse``), for any ``convention``.
    """
    with stats.sync_context(dist_sync_fn=stats.dist_sync_fn, should_sync=stats.sync_on_compute):
        raw = scatter(stats, unit=False)
    return {name: torch.linalg.eigvalsh(getattr(raw, name)).flip(0) for name in ("within", "between", "total")}


def collapse_metrics(
    stats: FeatureStatistics,
    classifier_weight: Tensor | None = None,
    *,
    rtol: float | None = None,
    convention: str | None = None,
    gnc_convention: str | None = None,
    tile: int = TILE,
    ood_mean: Tensor | None = None,
) -> dict[str, Tensor]:
    r"""Every collapse metric of the features summarised by ``stats`` (0-d float64 tensors; ranks int64).

    Gathers the states across processes first, like ``stats.compute()`` (all ranks must call it).

    Features h (Sigma_B, Sigma_B^pi, the mean of class means mu_bar: see the docstring of
    ``kdcollapse.metrics._collapse``):

    - ``nc1`` :math:`= \frac1K \mathrm{Tr}(\Sigma_W\Sigma_B^\dagger)`, ``fuzziness`` = K nc1
      (Papyan et al. 2020).
    - ``vci`` :math:`= 1 - \mathrm{Tr}(\Sigma_T^\dagger\Sigma_B^\pi)/\min(d, K-1)` (VCI paper Def. 5.3).
    - ``linear_probe_mse``: min over W, b of the least-squares probe loss (VCI paper Thm 5.1).
    - ``squared_distance`` :math:`= \mathrm{Tr}\,\Sigma_W / \mathrm{Tr}\,\Sigma_B`
      (Hui et al. 2022; VCI eq. 4).
    - ``cosine_within`` and ``class_separation`` (Kornblith et al. 2021).
    - ``nc2_equinorm``, ``nc2_equiangle`` of mu_k - mu_bar (Papyan et al. 2020); ``nc2_etf_error``, the
      Frobenius distance of their normalised Gram from the simplex ETF's (Kothapalli 2023).
    - ``cdnv``: mean over class pairs of (var_k + var_k') / (2 |mu_k - mu_k'|^2) (Galanti et al. 2022).
    - ``gnc1`` on L2-normalised features (GNC paper Sec. 2.2; its rank rule: ``_generalized``).
    - ``rank_between``, ``rank_total``, ``rank_between_unit``: ranks kept by the pseudo-inverses of Sigma_B,
      Sigma_T and the GNC Sigma_B; ``vci_rank`` = min(d, K-1).

    With ``classifier_weight`` W (K, d), e.g. ``model.head.weight``:

    - ``nc2_equinorm_w``, ``nc2_equiangle_w`` of the rows w_k;
      ``nc3`` :math:`= \lVert W/\lVert W\rVert_F - \tilde M/\lVert\tilde M\rVert_F\rVert_F^2`, rows of
      :math:`\tilde M` the mu_k - mu_bar (Papyan et al. 2020); ``nc3_self_duality``, the ETF error of the
      normalised cross-Gram W M~^T (Kothapalli 2023).
    - ``gnc2`` :math:`= \min_k \mathrm{dist}(\hat w_k, \mathrm{conv}\{\hat w_j\}_{j\ne k})` of the unit rows
      (GNC Def. 2.1, a distance) and ``gnc2_optimum``, its maximum for (K, d) where known (nan otherwise).
    - ``gnc3`` :math:`= \frac1K\sum_k (1 - \hat w_k^\top \bar h_k)`, h_k the class means of unit features.

    ``rtol`` overrides the pseudo-inverse threshold (default ``d * eps`` of float64, the dtype the states
    accumulate in whatever the features' dtype), ``convention`` (``"papyan"`` or ``"prior"``) the Sigma_B
    of NC1, fuzziness, squared distance and GNC1, ``gnc_convention`` (``"paper"`` or ``"official"``) the
    centring of GNC1 and GNC3; all three default to the ``stats``' own. The class-pairwise metrics never
    hold a K x K matrix: NC2's equiangularity and CDNV run in ``tile`` x ``tile`` blocks, the ETF errors
    through d x d Grams (``kdcollapse.metrics._pairwise``); NC4 is :class:`NearestClassMeanAccuracy`.

    rhubarbwu/neural-collapse's further measures: ``nc1_svd`` (NC1 with Sigma_B^+ from its K - 1 largest
    eigenvalues, Han et al. 2022), ``nc2g_{dist,log,riesz}_{mean,var}`` (hyperspherical uniformity of the unit
    centred class means, Liu et al. 2023; Wu & Papyan 2024's "GNC2"), ``unc3`` / ``unc3_cosine`` (with W: the
    variance over classes of w_k . (mu_k - mu_bar) / of its cosine, Wu & Papyan 2024) and, given ``ood_mean``
    (the mean feature of out-of-distribution data, ``FeatureMean``), ``nc5_ood_deviation`` (NECO, Ammar et al.
    2024). ``squared_distance`` is its NC1 "by quotient". docs/metrics.md lists both libraries' names side by side.
    """
    with stats.sync_context(dist_sync_fn=stats.dist_sync_fn, should_sync=stats.sync_on_compute):
        return metrics_from_statistics(stats, classifier_weight, rtol, convention, gnc_convention, tile, ood_mean)
