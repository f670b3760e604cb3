"""NC4: agreement of the nearest-class-mean classifier with the labels and with the network."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError
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


def _nearest(features: Tensor, centre: Tensor, means: Tensor, norms: Tensor) -> Tensor:
    """Index of the nearest of ``means`` (centred on ``centre``) for each row of ``features``, in row blocks."""
    nearest = torch.empty(features.shape[0], dtype=torch.int64, device=features.device)
    for block in torch.arange(features.shape[0], device=features.device).split(max(1, _SCORES // len(means))):
        h = (features[block].to(torch.float64) - centre).to(means.dtype)
        nearest[block] = (norms - 2 * h @ means.mT).argmin(dim=1)
    return nearest


def nearest_class_mean(features: Tensor, class_means: Tensor) -> Tensor:
    """Index of the nearest class mean (Euclidean) for each row of ``features`` ``(B, d)``.

    Computed about the mean of the class means, so ``|mu_k|^2 - 2 h^T mu_k`` does not cancel for features
    far from the origin, in float64, or in float32 when ``class_means`` are float32 (float32 accumulation:
    no K x d float64 copy; two distances closer than float32's rounding may then be ordered differently);
    rows go in blocks of at most ``2**24 / K`` (128 MiB of float64 distances whatever K, for
    vocabulary-sized K).
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
        for name in ("correct", "agree", "total", "compared"):
            self.add_state(name, torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, features: Tensor, labels: Tensor, logits: Tensor | None = None) -> None:
        """Add a batch: ``features`` (B, d), ``labels`` (B,), optional network ``logits`` (B, K)."""
        num_classes, dim = self.centred_means.shape
        check_batch(features, labels, num_classes, dim)
        predicted = _nearest(features.to(self.centre.device), self.centre, self.centred_means, self.norms)
        self.correct += (predicted == labels.to(predicted.device)).sum()
        self.total += labels.numel()
        if logits is not None:
            if not isinstance(logits, Tensor) or tuple(logits.shape) != (features.shape[0], num_classes):
                shape = tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__
                expected = (features.shape[0], num_classes)
                raise KdcollapseError(f"logits must have shape {expected}, got {shape}")
            self.agree += (predicted == logits.argmax(dim=1).to(predicted.device)).sum()
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
