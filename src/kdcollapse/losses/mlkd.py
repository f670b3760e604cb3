"""The batch- and class-level alignments of multi-level logit distillation, MLKD (Jin et al., CVPR 2023)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.losses import _references
from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses._reduce import logit_samples
from kdcollapse.losses._shapes import check_positive, check_tensor


FP16_NOTE = ("examples at τ = 1: at τ = 4 and K = 1000 the gradients are ~1e-11, below float16's "
             "smallest subnormal (6e-8), so float16 gradients underflow to 0 whatever the accumulation")


def _probabilities(student: Tensor, teacher: Tensor, temperature: float,
                   validate: bool | None) -> tuple[Tensor, Tensor]:
    """softmax(z/τ) of both (B, K) logits, validated, accumulated in float32 for half inputs."""
    check_positive("temperature", temperature)
    check_tensor("student", student, (2,))
    check_tensor("teacher", teacher, (2,))
    samples = logit_samples({"student": student, "teacher": teacher}, validate=validate)
    s, t = (x.to(samples.dtype) for x in samples.logits)
    return F.softmax(s / temperature, dim=-1), F.softmax(t / temperature, dim=-1)


def _gram_difference(a: Tensor, b: Tensor) -> Tensor:
    """a·aᵀ − b·bᵀ as ½[(a − b)(a + b)ᵀ + (a + b)(a − b)ᵀ]: the same matrix, but the difference is
    taken elementwise first, so a student close to its teacher loses no digits to cancellation."""
    d, s = a - b, a + b
    half = d @ s.T
    return (half + half.T) / 2


@register_loss("class_correlation", kind="logits",
               paper="Jin et al. 2023, Multi-level logit distillation (CVPR), class-level alignment",
               equation="(1/K)·‖P_tᵀP_t − P_sᵀP_s‖²_F, P = softmax(Z/τ) (B×K) (eq. 6)", temperature=True,
               sequences=False, ignore_index=False, chunked=False,
               example=lambda k, y: {"temperature": 1.0}, k_squared=("",), notes=FP16_NOTE,
               reference=_references.class_correlation)
def class_correlation_loss(student: Tensor, teacher: Tensor, temperature: float = 4.0, *,
                           validate: bool | None = None) -> Tensor:
    """(1/K)·Σ_jk (G_t − G_s)²_jk with the K×K class correlations G = Pᵀ P of the batch's
    probabilities P = softmax(Z/τ) (official ``cc_loss``). Needs the whole batch: (B, K) only."""
    p_s, p_t = _probabilities(student, teacher, temperature, validate)
    return _gram_difference(p_t.T, p_s.T).pow(2).sum() / p_s.shape[1]


@register_loss("batch_correlation", kind="logits",
               paper="Jin et al. 2023, Multi-level logit distillation (CVPR), batch-level alignment",
               equation="(1/B)·‖P_tP_tᵀ − P_sP_sᵀ‖²_F, P = softmax(Z/τ) (B×K) (eq. 5)", temperature=True,
               sequences=False, ignore_index=False, chunked=False,
               example=lambda k, y: {"temperature": 1.0}, notes=FP16_NOTE,
               reference=_references.batch_correlation)
def batch_correlation_loss(student: Tensor, teacher: Tensor, temperature: float = 4.0, *,
                           validate: bool | None = None) -> Tensor:
    """(1/B)·Σ_ij (G_t − G_s)²_ij with the B×B sample correlations G = P Pᵀ of the batch's
    probabilities P = softmax(Z/τ) (official ``bc_loss``). Needs the whole batch: (B, K) only."""
    p_s, p_t = _probabilities(student, teacher, temperature, validate)
    return _gram_difference(p_t, p_s).pow(2).sum() / p_s.shape[0]
