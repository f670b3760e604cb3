"""Vanilla knowledge distillation (Hinton et al., 2015)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses import _references
from kdcollapse.losses._reduce import constants, logit_samples, scaled_logits
from kdcollapse.losses._shapes import check_positive


def kl_rows(p_logits: Tensor, q_logits: Tensor) -> Tensor:
    """KL(softmax(p_logits) ‖ softmax(q_logits)) per row."""
    log_p, log_q = F.log_softmax(p_logits, dim=-1), F.log_softmax(q_logits, dim=-1)
    return (log_p.exp() * (log_p - log_q)).sum(-1)


@register_loss("kd", kind="logits", paper="Hinton et al. 2015, Distilling the knowledge in a neural network",
               equation="τ²·KL(softmax(z_t/τ) ‖ softmax(z_s/τ)) (Sec. 2)", temperature=True,
               sequences=True, ignore_index=False, chunked=True,
               example=lambda k, y: {"temperature": 2.0},
               reference=_references.kd)
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
    student, teacher = samples.logits
    if teacher.requires_grad or not constants(temperature):  # gradients beyond the student, or tensor weights
        kl = samples.per_row(lambda s, t: kl_rows(t / temperature, s / temperature), chunk_size=chunk_size)
    elif chunk_size is None:  # a frozen teacher: the lean exact gradient, upcast inside
        kl = _StudentKL.apply(student, teacher, temperature, samples.dtype)
    else:
        kl = samples.per_row(lambda s, t: _StudentKL.apply(s, t, temperature, s.dtype), chunk_size=chunk_size)
    return temperature**2 * samples.reduce(kl, reduction)


class _StudentKL(torch.autograd.Function):
    """KL(softmax(t/τ) ‖ softmax(s/τ)) per row, with its exact gradient in the student ``s``,
    (softmax(s/τ) − softmax(t/τ)) / τ, for a teacher ``t`` without gradient.

    Autograd would keep every intermediate of the forward pass (log-softmaxes, the teacher's
    probabilities, their difference). This keeps one (N, K) tensor in the accumulation dtype, p_s − p_t,
    filled block by block of rows (so the temporaries are those of one block), and the backward pass writes
    the gradient straight into a tensor of the student's dtype: forward + backward peak below ``F.kl_div`` on
    log-softmax / softmax inputs (results/benchmarks/bench_loss_memory.md). Per row, the values are those of
    :func:`kl_rows`.
    """

    @staticmethod
    def forward(ctx, student: Tensor, teacher: Tensor, temperature: float, dtype: torch.dtype) -> Tensor:
        difference = torch.empty(student.shape, dtype=dtype, device=student.device)
        rows = torch.empty(student.shape[0], dtype=dtype, device=student.device)
        block = max(1, BLOCK_ELEMENTS // max(1, student.shape[-1]))
        for start in range(0, student.shape[0], block):
            part = slice(start, start + block)
            log_s = F.log_softmax(scaled_logits(student[part], dtype, temperature), dim=-1)
            log_t = F.log_softmax(scaled_logits(teacher[part], dtype, temperature), dim=-1)
            p_t = log_t.exp()
            rows[part] = (p_t * (log_t - log_s)).sum(-1)
            torch.sub(log_s.exp_(), p_t, out=difference[part])
        ctx.temperature, ctx.student_dtype = temperature, student.dtype
        ctx.save_for_backward(difference)
        return rows

    @staticmethod
    @once_differentiable
    def backward(ctx, grad: Tensor):
        (difference,) = ctx.saved_tensors
        scale = (grad / ctx.temperature).unsqueeze(-1)
        out = torch.empty(difference.shape, dtype=ctx.student_dtype, device=difference.device)
        block = max(1, BLOCK_ELEMENTS // max(1, difference.shape[-1]))
        for start in range(0, difference.shape[0], block):  # block by block: a cast needs no full temporary
            part = slice(start, start + block)
            out[part] = difference[part] * scale[part]
        return out, None, None, None


BLOCK_ELEMENTS = 2**20  # rows of about this many logits at a time: the forward's temporaries stay small
