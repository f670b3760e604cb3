"""AKL, the adaptive Kullback-Leibler divergence (Wu et al., COLING 2025, "Rethinking Kullback-Leibler
Divergence in Knowledge Distillation for Large Language Models", Sec. 4).

With p the teacher's and q the student's distribution (softmax(z / τ)), sort the vocabulary by p
(descending); the *head* H is the most probable tokens whose cumulative probability, their own
included, is at most μ, and always the most probable token; the *tail* is the rest (the token whose
cumulative probability first exceeds μ is in the tail, as in the authors' code). With the
gaps g_head = Σ_{v∈H} |p_v − q_v| and g_tail = Σ_{v∉H} |p_v − q_v|, per token

    AKL = g_head / (g_head + g_tail) · KL(p ‖ q) + g_tail / (g_head + g_tail) · KL(q ‖ p).

The weights are constants for the student (the authors' code, ``wutaiqiang/LLM_KD_AKL`` ``AKL.py``,
computes the gaps from the detached student probabilities); where p = q (both gaps 0) the weights are
½, ½ and the value 0. Ties in p are ordered by token index (a stable sort), so the head of a teacher
whose probabilities tie at the boundary (stored top-k tokens, the rest spread evenly) is deterministic.
No τ² factor, as the other token divergences.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.losses import _references
from kdcollapse.losses._catalog import get_loss, register_loss
from kdcollapse.losses._divergence import Divergence, Parameter

HEAD_MASS = 0.5  # μ, the authors' default


def akl_weights(log_q: Tensor, log_p: Tensor, mu: float = HEAD_MASS) -> tuple[Tensor, Tensor]:
    """The head and tail weights g_head / (g_head + g_tail), g_tail / (g_head + g_tail) per row, from the
    student's (detached) and the teacher's log-probabilities (…, V)."""
    p, q = log_p.exp(), log_q.detach().exp()
    sorted_p, order = p.sort(dim=-1, descending=True, stable=True)
    gap = (sorted_p - q.gather(-1, order)).abs()
    tail = sorted_p.cumsum(-1) > mu
    tail[..., 0] = False  # the most probable token is always in the head
    head_gap, tail_gap = (gap * ~tail).sum(-1), (gap * tail).sum(-1)
    total = head_gap + tail_gap
    safe = torch.where(total > 0, total, 1)
    half = torch.full_like(total, 0.5)
    return torch.where(total > 0, head_gap / safe, half), torch.where(total > 0, tail_gap / safe, half)


@register_loss("akl", kind="logits", paper="Wu et al. 2025 (COLING), Rethinking KL divergence in KD for LLMs",
               equation="g_head/(g_head+g_tail)·KL(p ‖ q) + g_tail/(g_head+g_tail)·KL(q ‖ p), head = top-μ mass "
               "of p (Sec. 4)", temperature=True, sequences=True, ignore_index=False, chunked=True,
               example=lambda k, y: {"temperature": 2.0}, variants={"small head": lambda k, y: {"mu": 0.1}},
               reference=_references.akl,
               divergence=Divergence(parameters={"mu": Parameter(
                   HEAD_MASS, meaning="the head's probability mass μ (the authors' default 0.5; 1: forward KL)")}))
def akl_rows(log_q: Tensor, log_p: Tensor, mu: float = HEAD_MASS) -> Tensor:
    """AKL per row (module doc) from the student's and the teacher's log-probabilities (…, V)."""
    head, tail = akl_weights(log_q, log_p, mu)
    forward = (log_p.exp() * (log_p - log_q)).sum(-1)
    reverse = (log_q.exp() * (log_q - log_p)).sum(-1)
    return head * forward + tail * reverse


akl_loss = get_loss("akl").function  # akl_loss(student, teacher, mu=0.5, temperature=1.0, *, mask, ...)
