"""Adversarial-training objectives: TRADES (Zhang et al., 2019) and IKL-AT (DKL paper, §4.1)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses._shapes import flatten_logits
from kdcollapse.losses.dkl import ikl_on_samples


def trades_loss(logits_natural: Tensor, logits_adversarial: Tensor, target: Tensor,
                beta: float = 6.0, *, mask: Tensor | None = None) -> Tensor:
    """CE(f(x), y) + β·(1/B)·Σ_b KL(P_nat ‖ P_adv) (Zhang et al. 2019, TRADES).

    The KL is summed over classes and divided by the batch size (the official
    ``KLDivLoss(size_average=False) / batch_size``); the cross-entropy is a mean. As in the official
    code no gradient is stopped: P_nat is trained by the KL term as well. Shapes: (B, K) or
    (B, T, K) logits, ``target`` (B,) or (B, T), ``mask`` (B, T) bool.
    """
    names = {"logits_natural": logits_natural, "logits_adversarial": logits_adversarial}
    (nat, adv), y = flatten_logits(names, target=target, mask=mask)
    log_p_nat = F.log_softmax(nat, dim=-1)
    kl = (log_p_nat.exp() * (log_p_nat - F.log_softmax(adv, dim=-1))).sum(-1)
    return F.cross_entropy(nat, y) + beta * kl.mean()


def ikl_at_loss(logits_natural: Tensor, logits_adversarial: Tensor, target: Tensor,
                class_weights: Tensor | None, mse_weight: float = 20.0, ce_weight: float = 4.0, *,
                mask: Tensor | None = None) -> Tensor:
    """CE(f(x), y) + IKL(natural → adversarial) (DKL paper eq. 10 in adversarial training).

    The natural logits play o_m (the teacher side) and the adversarial logits o_n (the student
    side) of :func:`~kdcollapse.losses.ikl_loss`: the wMSE matches all logit differences of the
    adversarial output to the natural one *without* stopping the natural side's gradient
    ("breaking asymmetry", eq. 7), with class-wise weights ``class_weights[target]`` (K×K, row y =
    the model's mean clean probabilities of class y; None = sample-wise softmax(natural)); the soft
    cross-entropy uses S(softmax(natural)) at temperature 1 (official code). The defaults are those
    of the official CIFAR-100 training script (paper text: α = 20, β = 3). The official code divides the wMSE by
    Σ_b(Σ_j w_bj)², which equals B for row-normalised ``class_weights``; we average over samples.
    """
    names = {"logits_natural": logits_natural, "logits_adversarial": logits_adversarial}
    (nat, adv), y = flatten_logits(names, target=target, mask=mask)
    robust = ikl_on_samples(adv, nat, y, class_weights, mse_weight, ce_weight, temperature=1.0)
    return F.cross_entropy(nat, y) + robust
