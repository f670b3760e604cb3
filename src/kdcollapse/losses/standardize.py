"""Logit standardization (Sun et al., CVPR 2024, "Logit Standardization in Knowledge Distillation")."""

from __future__ import annotations

from torch import Tensor

OFFICIAL_EPS = 1e-7  # added to the standard deviation (official ``normalize``)


def standardize_logits(logits: Tensor, eps: float = OFFICIAL_EPS) -> Tensor:
    """Z-score of each row of logits over its classes: (z − mean(z)) / (eps + std(z)) (Algorithm 1).

    ``std`` is the unbiased (K − 1) standard deviation, as ``torch.std`` in the official code; the
    last dimension holds the classes, so (B, K) and (B, T, K) logits are both standardized per
    position. The authors standardize both the student's and the teacher's logits and then apply the
    loss at a "base temperature" (2 in their CIFAR-100 runs), which divides the z-scores.

    >>> import torch
    >>> standardize_logits(torch.tensor([[1.0, 2.0, 3.0]]))
    tensor([[-1.,  0.,  1.]])
    """
    mean = logits.mean(dim=-1, keepdim=True)
    return (logits - mean) / (eps + logits.std(dim=-1, keepdim=True))
