"""Intra-class contrastive loss L_Intra (intra-class contrastive KD paper, §3.2 eq. 4)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import _references
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses._reduce import accumulation_dtype, check_reduction, validating
from kdcollapse.losses._shapes import check_positive, check_tensor, check_values, describe


@register_loss("intra_class_contrastive", kind="features",
               paper="Intra-class contrastive loss (InfoNCE with one positive per anchor)",
               equation="−log e^{sim(a,p)/τ} / (e^{sim(a,p)/τ} + Σ_n e^{sim(a,n)/τ})", temperature=True,
               sequences=False, ignore_index=False, chunked=False,
               inputs=lambda: example_tensors((6, 8), (6, 8), (6, 5, 8)),
               reference=_references.intra_class_contrastive)
def intra_class_contrastive_loss(anchors: Tensor, positives: Tensor, negatives: Tensor,
                                 negative_mask: Tensor | None = None,
                                 temperature: float = 1.0, *, normalize: bool = True, reduction: str = "mean",
                                 validate: bool | None = None) -> Tensor:
    """mean_b −log exp(a·p/τ) / (exp(a·p/τ) + Σ_k exp(a·n_k/τ)) on L2-normalised embeddings.

    ``normalize=False`` takes the embeddings as given: eqs. 1, 4 and 7 as written, f(x)ᵀf(x⁺) of raw
    outputs (e.g. logits), where the similarities are unbounded; the default is the theory's ‖φ‖ = 1.

    The (n+1)-tuplet loss with negatives from the anchor's own class (L_Intra, eq. 4, where τ = 1):
    ``anchors`` and ``positives`` (an augmented view of each anchor) are (B, d), ``negatives``
    (B, m, d) are other samples of the anchor's class. ``negative_mask`` (B, m) bool marks valid
    negatives (False = ignored, e.g. padding when classes have different counts). An anchor with no
    valid negatives contributes −log(exp(a·p/τ)/exp(a·p/τ)) = 0: only the positive is left in the
    denominator. Masked negatives must still be finite (pad with zeros).
    Gradients reach all three inputs; the caller detaches what it wants fixed. ``reduction``
    "sum" / "none" give the sum / the (B,) per-anchor values; half inputs accumulate in float32.
    """
    check_positive("temperature", temperature)
    check_reduction(reduction)
    check_tensor("anchors", anchors, (2,))
    check_tensor("positives", positives, (2,))
    check_tensor("negatives", negatives, (3,), allow_empty=True)  # m = 0: no negatives
    batch, dim = anchors.shape
    if positives.shape != anchors.shape:
        raise KdcollapseError(f"positives must have the anchors' shape {(batch, dim)}, "
                              f"got {tuple(positives.shape)}")
    if negatives.shape[0] != batch or negatives.shape[2] != dim:
        raise KdcollapseError(f"negatives must have shape (B, m, d) = ({batch}, m, {dim}), "
                              f"got {tuple(negatives.shape)}")
    named = {"anchors": anchors, "positives": positives, "negatives": negatives}
    if negative_mask is not None and not (isinstance(negative_mask, Tensor)
                                          and negative_mask.dtype == torch.bool
                                          and negative_mask.shape == negatives.shape[:2]):
        raise KdcollapseError(f"negative_mask must be a bool tensor of shape "
                              f"{tuple(negatives.shape[:2])}, got {describe(negative_mask)}")
    if validating(validate):
        check_values(named)
    dtype = accumulation_dtype(anchors, positives, negatives)
    a, p, n = (x.to(dtype) for x in (anchors, positives, negatives))
    if normalize:
        a, p, n = (F.normalize(x, dim=-1) for x in (a, p, n))
    positive_logit = (a * p).sum(-1, keepdim=True) / temperature  # (B, 1)
    negative_logits = torch.einsum("bd,bmd->bm", a, n) / temperature  # (B, m)
    if negative_mask is not None:
        negative_logits = negative_logits.masked_fill(~negative_mask, float("-inf"))
    logits = torch.cat([positive_logit, negative_logits], dim=-1)
    values = torch.logsumexp(logits, dim=-1) - positive_logit.squeeze(-1)
    if reduction == "none":
        return values
    return values.mean() if reduction == "mean" else values.sum()
