"""Within-class cosine distance of a batch, the regulariser of the VCI paper §6.3 (after Kornblith et al. 2021)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses._catalog import example_tensors, register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._reduce import accumulation_dtype
from kdcollapse.losses._shapes import check_tensor


@register_loss("within_class_cosine", kind="features",
               paper="Kornblith et al. 2021; the VCI paper §6.3 (a regulariser)",
               equation="mean over classes of (1/n_k²) Σ_{i,j∈k} (1 − sim(h_i, h_j))", temperature=False,
               sequences=False, ignore_index=False, chunked=False,
               inputs=lambda: (*example_tensors((8, 4)), torch.tensor([0, 0, 1, 1, 2, 2, 0, 1])),
               checks_values=False, compiles=False,
               notes="labels.unique() is data-dependent, so torch.compile breaks the graph",
               reference=_references.within_class_cosine)
def within_class_cosine_distance(features: Tensor, labels: Tensor) -> Tensor:
    r"""d̄_within of the batch: the mean over the classes present of (1/n_k²) Σ_{i,j∈k} (1 − sim(h_i, h_j)).

    Kornblith et al. (2021)'s within-class cosine distance (the VCI paper's "Cosine Similarity" metric)
    computed on one batch: classes absent from the batch are skipped, pairs i = j are included (they add
    0, as in the metric's K·N² normalisation). Per class it equals 1 − ‖(1/n_k) Σ_i ĥ_i‖² with ĥ the
    L2-normalised features, so it costs O(B·d). Minimising λ·d̄_within pulls each class's features
    towards one direction (cosine collapse); differentiable in ``features`` (B, d). Zero feature vectors
    are normalised to zero (``torch.nn.functional.normalize``), so they count as similarity 0.
    """
    check_tensor("features", features, (2,))
    if labels.shape != features.shape[:1] or labels.dtype not in (torch.int32, torch.int64):
        raise KdcollapseError(f"labels must be integers of shape ({features.shape[0]},), "
                              f"got {labels.dtype} of shape {tuple(labels.shape)}")
    unit = F.normalize(features.to(accumulation_dtype(features)), dim=1)  # half inputs: float32
    classes, index, counts = labels.unique(return_inverse=True, return_counts=True)
    sums = unit.new_zeros(len(classes), unit.shape[1]).index_add_(0, index, unit)
    mean_unit = sums / counts[:, None].to(unit.dtype)
    return (1 - mean_unit.pow(2).sum(1)).mean()
