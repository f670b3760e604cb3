"""ABKD, the α-β divergence of Wang et al. (ICML 2025, "ABKD: Pursuing a Proper Allocation of the
Probability Mass in Knowledge Distillation via α-β-Divergence").

With p the teacher's and q the student's distribution (softmax(z / τ)), per token

    D_AB(p ‖ q) = −1/(αβ) Σ_v [p_v^α q_v^β − α/(α+β) p_v^(α+β) − β/(α+β) q_v^(α+β)],

continued to its limits where a factor vanishes (Cichocki, Cruces & Amari 2011, the limits of the
general formula, tested):

* α = 0, β ≠ 0: (1/β²) Σ [q^β log(q^β / p^β) − q^β + p^β];
* β = 0, α ≠ 0: (1/α²) Σ [p^α log(p^α / q^α) − p^α + q^α];
* α + β = 0, α ≠ 0: (1/α²) Σ [log(q^α / p^α) + p^α / q^α − 1];
* α = β = 0: ½ Σ (log q − log p)².

The official ``ab_div`` (ghwang-s/abkd) agrees in the general case and at α = β = 0, but its first three
special cases divide by β (α) where the limit divides by β² (α²): they are the limit times β (times α),
a jump at those lines that this module does not reproduce (equal at (1, 0) and (0, 1); tested).
(α, β) = (1, 0) is KL(p ‖ q) and (0, 1) is KL(q ‖ p); β = 1 − α is Amari's α-divergence and
(½, ½) twice the squared Hellinger distance 2 Σ (√p − √q)² (tested). Every power is formed in log
space (exp(α log p + β log q)), so nothing is clamped. Defaults α = 0.2, β = 0.7: the official GPT-2
scripts' (``distillation_llm/scripts/gpt2/ab/``; the argument parser's default is 0.5, 0.5); each is
taken in [−2, 2] (the paper's choices lie in [0, 1]; beyond, p^α overflows quickly). No τ² factor, as
the other token divergences.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.losses import _token_references
from kdcollapse.losses._catalog import get_loss, register_loss
from kdcollapse.losses._divergence import Divergence, Parameter

ALPHA, BETA = 0.2, 0.7


@register_loss("abkd", kind="logits", paper="Wang et al. 2025 (ICML), ABKD: α-β-divergence",
               equation="−1/(αβ) Σ [p^α q^β − α/(α+β) p^(α+β) − β/(α+β) q^(α+β)] and its limits",
               temperature=True, sequences=True, ignore_index=False, chunked=True,
               example=lambda k, y: {"alpha": 0.2, "beta": 0.7, "temperature": 2.0},
               variants={"forward kl": lambda k, y: {"alpha": 1.0, "beta": 0.0},
                         "alpha = 0": lambda k, y: {"alpha": 0.0, "beta": 0.5, "temperature": 2.0},
                         "beta = 0": lambda k, y: {"alpha": 0.4, "beta": 0.0},
                         "alpha + beta = 0": lambda k, y: {"alpha": 0.2, "beta": -0.2},
                         "log-euclidean": lambda k, y: {"alpha": 0.0, "beta": 0.0}},
               divergence=Divergence(parameters={
                   "alpha": Parameter(ALPHA, -2.0, 2.0, "the teacher's exponent α (official GPT-2 scripts 0.2)"),
                   "beta": Parameter(BETA, -2.0, 2.0, "the student's exponent β (official GPT-2 scripts 0.7)")}),
               reference=_token_references.abkd)
def abkd_rows(log_q: Tensor, log_p: Tensor, alpha: float = ALPHA, beta: float = BETA) -> Tensor:
    """D_AB(p ‖ q) per row (module doc) from the student's and the teacher's log-probabilities (…, V),
    formed in float32 at least (p^α / q^α overflows half precision where α + β = 0)."""
    wide = torch.promote_types(log_q.dtype, torch.float32)
    log_q, log_p = log_q.to(wide), log_p.to(wide)
    if alpha == 0 and beta == 0:
        return 0.5 * ((log_q - log_p) ** 2).sum(-1)
    if alpha == 0:
        q_beta = (beta * log_q).exp()
        return ((q_beta * (log_q - log_p)).sum(-1) + ((beta * log_p).exp() - q_beta).sum(-1) / beta) / beta
    if beta == 0:
        p_alpha = (alpha * log_p).exp()
        return ((p_alpha * (log_p - log_q)).sum(-1) + ((alpha * log_q).exp() - p_alpha).sum(-1) / alpha) / alpha
    if alpha + beta == 0:
        return ((log_q - log_p) + ((alpha * (log_p - log_q)).exp() - 1) / alpha).sum(-1) / alpha
    total = alpha + beta
    mixed = (alpha * log_p + beta * log_q).exp()
    return -(mixed - alpha / total * (total * log_p).exp() - beta / total * (total * log_q).exp()).sum(-1) / (
        alpha * beta)


abkd_loss = get_loss("abkd").function  # abkd_loss(student, teacher, alpha=0.2, beta=0.7, temperature=1.0, *, ...)
