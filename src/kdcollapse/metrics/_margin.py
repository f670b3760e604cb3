"""The classification margin z_y − max_{j≠y} z_j, one function for attacks, analysis and methods."""

from __future__ import annotations

from torch import Tensor


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
    z_y = scores.gather(1, target[:, None]).squeeze(1)
    others = scores.scatter(1, target[:, None], float("-inf"))
    return z_y - others.amax(dim=1)
