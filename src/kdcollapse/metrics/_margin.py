"""The classification margin z_y − max_{j≠y} z_j, one function for attacks, analysis and methods."""

from __future__ import annotations

from torch import Tensor

from kdcollapse.errors import KdcollapseError


def margin(scores: Tensor, target: Tensor) -> Tensor:
    r"""Margin of each row of ``scores`` (B, K) for its ``target`` class (B,): shape (B,).

    .. math:: m(z, y) = z_y - \max_{j \ne y} z_j

    Negative exactly when another class scores higher than the target (ties give 0). On logits it is
    the logit margin of ``kdcollapse analyze`` and the Square attack's loss (Andriushchenko et al. 2020,
    the numerator of DLR); on softmax probabilities it is ρ_x of the intra-class teacher's gate (eq. 6).
    Also exported as ``kdcollapse.adversarial.margin`` and ``kdcollapse.analysis.logit_margins``.

    >>> import torch
    >>> margin(torch.tensor([[3.0, 1.0, 2.0], [0.0, 4.0, 1.0]]), torch.tensor([0, 2]))
    tensor([ 1., -3.])
    """
    if scores.ndim != 2 or target.shape != scores.shape[:1]:
        raise KdcollapseError(f"margin needs scores (B, K) and target (B,), got {tuple(scores.shape)} and "
                              f"{tuple(target.shape)}")
    if target.numel() and not ((target >= 0) & (target < scores.shape[1])).all():
        bad = target[(target < 0) | (target >= scores.shape[1])][0].item()
        raise KdcollapseError(f"margin: target class {bad} is outside 0..{scores.shape[1] - 1} "
                              f"(K = {scores.shape[1]} columns)")
    z_y = scores.gather(1, target[:, None]).squeeze(1)
    others = scores.scatter(1, target[:, None], float("-inf"))
    return z_y - others.amax(dim=1)
