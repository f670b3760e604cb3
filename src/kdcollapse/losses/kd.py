"""Vanilla knowledge distillation (Hinton et al., 2015)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses._reduce import logit_samples
from kdcollapse.losses._shapes import check_positive


def kl_rows(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """KL(softmax(p_logits) ‖ softmax(q_logits)) per row."""
    log_p, log_q = F.log_softmax(p_logits, dim=-1), F.log_softmax(q_logits, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@register_loss("kd", kind="logits", paper="Hinton et al. 2015, Distilling the knowledge in a neural network",
               equation="τ²·KL(softmax(z_t/τ) ‖ softmax(z_s/τ)) (Sec. 2)", temperature=True,
               sequences=True, ignore_index=False, chunked=True,
               example=lambda k, y: {"temperature": 2.0})
def kd_loss(student: Tensor, teacher: Tensor, temperature: float = 4.0, *,
            mask: Tensor | None = None, reduction: str = "mean", vocab_size: int | None = None,
            chunk_size: int | None = None, validate: bool | None = None) -> Tensor:
    """τ² · mean_b KL(softmax(z_t/τ) ‖ softmax(z_s/τ)) (Hinton et al. 2015).

    ``student``, ``teacher``: logits (B, K) or (B, T, K); ``mask`` (B, T) bool or 0/1 selects
    positions. Gradients flow into both arguments as in the KL itself; a frozen teacher simply has
    none. The LLM options (``reduction``, ``vocab_size``, ``chunk_size``, ``validate``) and the
    float32 accumulation of half-precision logits are described in ``docs/losses.md``.
    """
    check_positive("temperature", temperature)
    samples = logit_samples({"student": student, "teacher": teacher}, mask=mask,
                            vocab_size=vocab_size, validate=validate, reduction=reduction)
    kl = samples.per_row(lambda s, t: kl_rows(t / temperature, s / temperature),
                         chunk_size=chunk_size)
    return temperature**2 * samples.reduce(kl, reduction)
