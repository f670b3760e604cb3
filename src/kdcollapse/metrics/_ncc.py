"""NC4: agreement of the nearest-class-mean classifier with the labels and with the network."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics._linalg import CHUNK_ROWS
from kdcollapse.metrics._metric import Metric
from kdcollapse.metrics._statistics import check_batch


_SCORES = 2**24  # entries of one (rows, K) block of distances in nearest_class_mean: 128 MiB in float64


def _work_dtype(class_means: Tensor) -> torch.dtype:
    """float32 means (float32 accumulation) stay float32; every other dtype is widened to float64."""
    return torch.float32 if class_means.dtype == torch.float32 else torch.float64


def centred_means(class_means: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(centre, means - centre, |means - centre|^2): the mean of the class means (float64, d), the class means
    about it in float32 if given in float32 else float64 (the one K x d copy NC4 makes), their squared norms."""
    dtype = _work_dtype(class_means)
    centre = class_means.mean(0, dtype=torch.float64)
    widened = class_means.to(dtype)  # no copy for float32 and float64 means
    means = widened - centre.to(dtype) if widened is class_means else widened.sub_(centre)
    return centre, means, means.square().sum(1, dtype=torch.float64).to(dtype)


# The float32 screening's rounding: unit roundoff of float32.
_UNIT = 2.0**-24


def _screen_bound(h: Tensor, dim: int, largest_mean: float) -> Tensor:
    """Per row, a bound on |float32 score - exact score| over every class, score_k = |mu_k|^2 - 2 h.mu_k: h and mu
    rounded to float32 (u |h||mu| each), the d-term float32 dot product (<= d u |h||mu| worst case, any summation
    order, FMA or not), |mu_k|^2 rounded (u |mu|^2) and the final subtraction (u (|mu|^2 + 2|h||mu|)), with 1 %
    to spare for the second-order terms."""
    norms = torch.linalg.vector_norm(h, dim=1)
    return 1.01 * _UNIT * ((2 * dim + 8) * norms * largest_mean + 3 * largest_mean**2)


def _exact(h: Tensor, means: Tensor, norms: Tensor) -> Tensor:
    """argmin_k |mu_k|^2 - 2 h.mu_k in float64 (``means`` float64, or float32 widened a chunk of classes at a
    time): the float64 answer."""
    if means.dtype == torch.float64:
        return (norms - 2 * h @ means.mT).argmin(dim=1)
    best = torch.full((h.shape[0],), math.inf, dtype=torch.float64, device=h.device)
    index = torch.zeros(h.shape[0], dtype=torch.int64, device=h.device)
    for start in range(0, means.shape[0], CHUNK_ROWS):
        chunk = slice(start, start + CHUNK_ROWS)
        scores = norms[chunk].double() - 2 * h @ means[chunk].double().mT
        value, where = scores.min(dim=1)
        better = value < best  # strict: the first of equal scores wins, as argmin over all K
        best, index = torch.where(better, value, best), torch.where(better, where + start, index)
    return index


def _nearest(features: Tensor, centre: Tensor, means: Tensor, norms: Tensor, screen: tuple[Tensor, Tensor] | None = None,
             largest_mean: float | None = None) -> Tensor:
    """Index of the nearest of ``means`` (centred on ``centre``) for each row of ``features``, in row blocks.

    Every block is screened in float32 (``screen``: float32 means and their squared norms; the means themselves if
    float32): the nearest and second-nearest scores are compared, and rows whose gap is within 4 times the float32
    error bound (``_screen_bound``) are decided again in float64 (``_exact``), so every answer equals the float64
    computation's (tested with constructed near ties)."""
    screen_means, screen_norms = screen if screen is not None else (means.float(), norms.float())
    if largest_mean is None:
        largest_mean = float(norms.double().max().clamp_min(0).sqrt())
    dim = means.shape[1]
    nearest = torch.empty(features.shape[0], dtype=torch.int64, device=features.device)
    for block in torch.arange(features.shape[0], device=features.device).split(max(1, _SCORES // len(means))):
        h = features[block].to(torch.float64) - centre
        scores = screen_norms - 2 * h.float() @ screen_means.mT
        first = scores.argmin(dim=1, keepdim=True)
        best = scores.gather(1, first)
        second = scores.scatter_(1, first, math.inf).min(dim=1, keepdim=True).values
        close = ((second - best).squeeze(1).double() <= 4 * _screen_bound(h, dim, largest_mean)).nonzero().flatten()
        choice = first.squeeze(1)
        if close.numel():
            choice[close] = _exact(h[close], means, norms)
        nearest[block] = choice
    return nearest


def nearest_class_mean(features: Tensor, class_means: Tensor) -> Tensor:
    """Index of the nearest class mean (Euclidean) for each row of ``features`` ``(B, d)``.

    Computed about the mean of the class means, so ``|mu_k|^2 - 2 h^T mu_k`` does not cancel for features
    far from the origin; screened in float32 with a float64 re-check of the rows whose two nearest means are
    within the float32 error (``_nearest``), so the answer is the float64 one (for float32 ``class_means``, of
    their float32 centred copy taken in float64; no K x d float64 copy is made for them); rows go in blocks of at most ``2**24 / K``
    (64 MiB of float32 distances whatever K, for vocabulary-sized K).
    """
    return _nearest(features, *centred_means(class_means))


class NearestClassMeanAccuracy(Metric):
    r"""NC4 (Papyan et al. 2020) as a second pass over the data, given the class means of the first.

    ``compute()`` returns ``ncc_accuracy``, the fraction of samples whose nearest class mean is their
    label, and ``ncc_agreement``, the fraction whose nearest class mean is the network's prediction
    (argmax of the ``logits`` passed to ``update``; nan if none were passed). NC4 says the agreement
    tends to 1.

    >>> metric = NearestClassMeanAccuracy(torch.tensor([[0.0, 0.0], [4.0, 0.0]]))
    >>> metric.update(torch.tensor([[1.0, 0.0], [3.0, 1.0], [2.5, 0.0]]), torch.tensor([0, 1, 0]),
    ...               logits=torch.tensor([[2.0, 1.0], [0.0, 1.0], [0.0, 1.0]]))
    >>> {k: round(float(v), 4) for k, v in metric.compute().items()}
    {'ncc_accuracy': 0.6667, 'ncc_agreement': 1.0}
    """

    is_differentiable = False
    higher_is_better = True
    full_state_update = False

    correct: Tensor
    agree: Tensor
    total: Tensor
    compared: Tensor

    def __init__(self, class_means: Tensor, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(class_means, Tensor) or class_means.ndim != 2 or class_means.shape[0] < 2:
            shape = tuple(class_means.shape) if isinstance(class_means, Tensor) else "not a tensor"
            raise KdcollapseError(f"class_means must be a (K, d) tensor with K >= 2, got {shape}")
        if not bool(torch.isfinite(class_means).all()):
            raise KdcollapseError("class_means contain NaN or inf (a class without samples?)")
        centre, means, norms = centred_means(class_means.detach())
        # The means about their centre in float64 (float32 if given float32): the metric's one K x d copy.
        self.register_buffer("centre", centre, persistent=False)
        self.register_buffer("centred_means", means, persistent=False)
        self.register_buffer("norms", norms, persistent=False)
        # NC4 screens in float32 (``_nearest``): float64 means get a float32 copy of theirs, half a K x d float64 copy
        screen = means if means.dtype == torch.float32 else means.float()
        self.register_buffer("screen_means", screen, persistent=False)
        self.register_buffer("screen_norms", norms.float(), persistent=False)
        self.largest_mean = float(norms.double().max().clamp_min(0).sqrt())
        for name in ("correct", "agree", "total", "compared"):
            self.add_state(name, torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, features: Tensor, labels: Tensor, logits: Tensor | None = None, *,
               predictions: Tensor | None = None) -> None:
        """Add a batch: ``features`` (B, d), ``labels`` (B,), optional network ``logits`` (B, K) or, instead,
        the network's ``predictions`` (B,): ``logits.argmax(dim=1)`` taken beforehand."""
        num_classes, dim = self.centred_means.shape
        check_batch(features, labels, num_classes, dim)
        if predictions is not None:
            if logits is not None:
                raise KdcollapseError("give the network's logits or its predictions, not both")
            if not isinstance(predictions, Tensor) or tuple(predictions.shape) != (features.shape[0],):
                shape = tuple(predictions.shape) if isinstance(predictions, Tensor) else type(predictions).__name__
                raise KdcollapseError(f"predictions must have shape {(features.shape[0],)}, got {shape}")
        if logits is not None:  # checked before any state changes
            if not isinstance(logits, Tensor) or tuple(logits.shape) != (features.shape[0], num_classes):
                shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
                expected = (features.shape[0], num_classes)
                raise KdcollapseError(f"logits must have shape {expected}, got {shape}")
            predictions = logits.argmax(dim=1)
        predicted = _nearest(features.to(self.centre.device), self.centre, self.centred_means, self.norms,
                             (self.screen_means, self.screen_norms), self.largest_mean)
        self.correct += (predicted == labels.to(predicted.device)).sum()
        self.total += labels.numel()
        if predictions is not None:
            self.agree += (predicted == predictions.to(predicted.device)).sum()
            self.compared += labels.numel()

    def compute(self) -> dict[str, Tensor]:
        if int(self.total) == 0:
            raise KdcollapseError("NearestClassMeanAccuracy holds no samples: call update first")
        nan = torch.tensor(float("nan"), dtype=torch.float64)
        agreement = self.agree.double() / self.compared if int(self.compared) else nan
        return {"ncc_accuracy": self.correct.double() / self.total, "ncc_agreement": agreement}


def ncc_accuracy(
    features: Tensor, labels: Tensor, class_means: Tensor, logits: Tensor | None = None
) -> dict[str, Tensor]:
    """Functional twin of :class:`NearestClassMeanAccuracy` for one ``(N, d)`` tensor of features."""
    metric = NearestClassMeanAccuracy(class_means, sync_on_compute=False).to(features.device)
    metric.update(features, labels, logits)
    return metric.compute()
