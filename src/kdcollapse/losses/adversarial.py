"""Adversarial-training objectives: TRADES (Zhang et al., 2019) and IKL-AT (DKL paper, §4.1)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses._catalog import class_table, register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._reduce import IGNORE_INDEX, logit_samples
from kdcollapse.losses.dkl import ikl_on_samples
from kdcollapse.losses.kd import kl_rows


@register_loss("trades", reference_first=True,
               kind="logits+target", paper="Zhang et al. 2019, TRADES (ICML)",
               equation="CE(f(x), y) + β·KL(P_nat ‖ P_adv) (eq. 5)", temperature=False, sequences=True,
               ignore_index=True, chunked=True, example=lambda k, y: {"target": y},
               reference=_references.trades)
def trades_loss(logits_natural: Tensor, logits_adversarial: Tensor, target: Tensor,
                beta: float = 6.0, *, mask: Tensor | None = None, ignore_index: int = IGNORE_INDEX,
                reduction: str = "mean", chunk_size: int | None = None,
                validate: bool | None = None) -> Tensor:
    """CE(f(x), y) + β·(1/B)·Σ_b KL(P_nat ‖ P_adv) (Zhang et al. 2019, TRADES).

    The KL is summed over classes and divided by the batch size (the official
    ``KLDivLoss(size_average=False) / batch_size``); the cross-entropy is a mean. As in the official
    code no gradient is stopped: P_nat is trained by the KL term as well. Shapes: (B, K) or
    (B, T, K) logits, ``target`` (B,) or (B, T) (``ignore_index`` labels dropped), ``mask`` (B, T)
    bool or 0/1. LLM options and precision: ``docs/losses.md``.
    """
    names = {"logits_natural": logits_natural, "logits_adversarial": logits_adversarial}
    samples = logit_samples(names, target=target, mask=mask, ignore_index=ignore_index,
                            validate=validate, reduction=reduction)
    ce, kl = samples.per_row(lambda nat, adv, y: (F.cross_entropy(nat, y, reduction="none"),
                                                  kl_rows(nat, adv)),
                             samples.target, chunk_size=chunk_size)
    return samples.reduce(ce, reduction) + beta * samples.reduce(kl, reduction)


@register_loss("ikl_at", reference_first=True,
               kind="logits+target", paper="Cui et al. 2024, DKL paper §4.1 (IKL-AT)",
               equation="CE(f(x), y) + IKL(natural → adversarial) (eq. 10)", temperature=False,
               sequences=True, ignore_index=True, chunked=True,
               example=lambda k, y: {"target": y, "class_weights": class_table(k)},
               variants={"sample_weights": lambda k, y: {"target": y, "class_weights": None}},
               k_squared=("",),
               reference=_references.ikl_at)
def ikl_at_loss(logits_natural: Tensor, logits_adversarial: Tensor, target: Tensor,
                class_weights: Tensor | None, mse_weight: float = 20.0, ce_weight: float = 4.0, *,
                mask: Tensor | None = None, ignore_index: int = IGNORE_INDEX,
                reduction: str = "mean", chunk_size: int | None = None,
                validate: bool | None = None) -> Tensor:
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
    samples = logit_samples(names, target=target, mask=mask, ignore_index=ignore_index,
                            validate=validate, reduction=reduction)
    ikl = ikl_on_samples(samples, class_weights, mse_weight, ce_weight, 1.0, validate)
    ce, robust = samples.per_row(lambda nat, adv, y: (F.cross_entropy(nat, y, reduction="none"),
                                                      ikl(adv, nat, y)),
                                 samples.target, chunk_size=chunk_size)
    return samples.reduce(ce, reduction) + samples.reduce(robust, reduction)
