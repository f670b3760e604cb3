r"""Intra-class diversity of unit embeddings: the quantities of Theorems 1-2 of the intra-class
contrastive KD paper (§4), as a streaming metric and a functional twin.

With φ the L2-normalised embeddings and C(x) the samples sharing x's label,

.. math::
    d_\mathrm{intra} = \mathbb{E}_{x^-\in C(x)}\, e^{\varphi(x)^\top\varphi(x^-)},\qquad
    d_\mathrm{inter} = \mathbb{E}_{x^-\notin C(x)}\, e^{\varphi(x)^\top\varphi(x^-)},

both in [e⁻¹, e]; they are expected *similarities*, so a smaller d_intra means a more diverse class.
The batch tuplet losses use an augmented view φ(x⁺) as the positive and the batch's same-class
(``tuplet_intra``) or other-class (``tuplet_inter``) samples as negatives:
:math:`\log(e^{\varphi(x)^\top\varphi(x^+)} + \sum_{x^-} e^{\varphi(x)^\top\varphi(x^-)}) - \varphi(x)^\top\varphi(x^+)`.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics._metric import Metric

_SUMS = ("intra_sum", "intra_pairs", "inter_sum", "inter_pairs",
         "tuplet_intra_sum", "tuplet_intra_count", "tuplet_inter_sum", "tuplet_inter_count")


def similarity_sums(embeddings: Tensor, labels: Tensor, block_size: int = 2048) -> Tensor:
    """float64 [Σ_same exp(φᵢᵀφⱼ), #same, Σ_other exp(φᵢᵀφⱼ), #other] over ordered pairs i ≠ j.

    ``embeddings`` (N, d) are L2-normalised here; "same" pairs share a label. Rows are processed in
    blocks of ``block_size``, so memory is O(block_size·N).
    """
    phi = F.normalize(embeddings.float(), dim=1)
    sums = torch.zeros(4, dtype=torch.float64, device=phi.device)
    index = torch.arange(len(phi), device=phi.device)
    for start in range(0, len(phi), block_size):
        rows = slice(start, start + block_size)
        similar = (phi[rows] @ phi.T).exp().double()
        same = labels[rows, None] == labels[None, :]
        other_sample = index[rows, None] != index[None, :]
        same_pairs, other_pairs = same & other_sample, ~same
        sums += torch.stack([(similar * same_pairs).sum(), same_pairs.sum(),
                             (similar * other_pairs).sum(), other_pairs.sum()])
    return sums


def intra_inter_distances(embeddings: Tensor, labels: Tensor, block_size: int = 2048) -> tuple[float, float]:
    """(d_intra, d_inter) over every ordered pair of distinct samples of a set (the paper's §4.2).

    ``embeddings`` (N, d) are L2-normalised here, ``labels`` (N,) define C(x).

    >>> h = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> [round(v, 4) for v in intra_inter_distances(h, torch.tensor([0, 0, 1]))]
    [2.7183, 1.0]
    """
    same, n_same, other, n_other = similarity_sums(embeddings, labels, block_size).tolist()
    return same / max(n_same, 1), other / max(n_other, 1)


class IntraClassSimilarity(Metric):
    r"""d_intra, d_inter, their ratio and the batch tuplet losses, averaged over every batch seen.

    ``update(anchors, positives, labels)`` takes one batch of L2-normalised embeddings (B, d), their
    augmented views' embeddings (B, d) and the labels (B,); pairs and tuplets never cross batches.
    ``compute()`` returns float64 0-d tensors ``d_intra``, ``d_inter``, ``d_ratio``, ``tuplet_intra``,
    ``tuplet_inter``, ``tuplet_ratio`` (nan where a batch never had such pairs). States are sums, so
    processes merge exactly (``dist_reduce_fx="sum"``).

    >>> metric = IntraClassSimilarity()
    >>> a = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]])
    >>> metric.update(a, a, torch.tensor([0, 0, 1]))
    >>> {k: round(float(v), 4) for k, v in metric.compute().items()}  # doctest: +NORMALIZE_WHITESPACE
    {'d_intra': 2.7183, 'd_inter': 1.0, 'd_ratio': 2.7183, 'tuplet_intra': 0.6931, 'tuplet_inter': 0.3927,
     'tuplet_ratio': 1.7653}
    """

    KEYS = ("d_intra", "d_inter", "d_ratio", "tuplet_intra", "tuplet_inter", "tuplet_ratio")
    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        for name in _SUMS:
            self.add_state(name, torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")

    @torch.no_grad()
    def update(self, anchors: Tensor, positives: Tensor, labels: Tensor) -> None:
        """Add one batch: unit ``anchors`` and ``positives`` (B, d), ``labels`` (B,)."""
        if anchors.ndim != 2 or positives.shape != anchors.shape or labels.shape != anchors.shape[:1]:
            raise KdcollapseError(f"IntraClassSimilarity.update needs anchors and positives of one shape (B, d) "
                                  f"and labels (B,); got {tuple(anchors.shape)}, {tuple(positives.shape)}, "
                                  f"{tuple(labels.shape)}")
        same, n_same, other, n_other = similarity_sums(anchors, labels)
        similar = anchors @ anchors.T
        positive = (anchors * positives).sum(1, keepdim=True)
        same_class = labels[:, None] == labels[None, :]
        eye = torch.eye(len(labels), dtype=torch.bool, device=labels.device)
        values = {"intra_sum": same, "intra_pairs": n_same, "inter_sum": other, "inter_pairs": n_other}
        for name, negatives in (("tuplet_intra", same_class & ~eye), ("tuplet_inter", ~same_class)):
            logits = torch.cat([positive, similar.masked_fill(~negatives, float("-inf"))], dim=1)
            has = negatives.any(1)
            values[f"{name}_sum"] = ((logits.logsumexp(1) - positive.squeeze(1)) * has).sum()
            values[f"{name}_count"] = has.sum()
        for name, value in values.items():
            setattr(self, name, getattr(self, name) + value.to(torch.float64))

    def compute(self) -> dict[str, Tensor]:
        d_intra, d_inter = _ratio(self.intra_sum, self.intra_pairs), _ratio(self.inter_sum, self.inter_pairs)
        tuplet_intra = _ratio(self.tuplet_intra_sum, self.tuplet_intra_count)
        tuplet_inter = _ratio(self.tuplet_inter_sum, self.tuplet_inter_count)
        return {"d_intra": d_intra, "d_inter": d_inter, "d_ratio": _ratio(d_intra, d_inter),
                "tuplet_intra": tuplet_intra, "tuplet_inter": tuplet_inter,
                "tuplet_ratio": _ratio(tuplet_intra, tuplet_inter)}


def _ratio(a: Tensor, b: Tensor) -> Tensor:
    """a / b, nan where b is 0 (no pairs) or nan."""
    return torch.where(b != 0, a / b, torch.full_like(a, float("nan")))
