"""DistiLLM-2's contrastive objective (Ko et al., ICML 2025, "DistiLLM-2: A Contrastive Approach Boosts
the Distillation of LLMs"; official trainer ``jongwooko/distillm-2/src/distillm_trainer.py``,
``loss_type="distillm_v2"``).

Each sequence of a batch is a response to a prompt written either by the teacher (DistiLLM-2's "chosen"
half) or by the student (its "rejected" half); the batch says which with a boolean ``student_response``
(True where the student wrote the response). With p the teacher's and q the student's distribution per
token and α the skew:

* on the teacher's responses, the skew KL: KL(p ‖ α p + (1 − α) q), pulling q up where p is high;
* on the student's responses, the skew reverse KL with the student's share of the mixture held fixed:
  KL(q ‖ (1 − α) p + α sg(q)) (sg: no gradient, as the official ``vocab_logps.detach()``), pushing q down
  where p is low.

The official loss is, per pair, the mean over the response tokens of each half, summed over the two halves
and averaged over pairs (``reduction="sequence"`` here: the mean over teacher responses of their token means
plus the mean over student responses of theirs); ``"mean"`` is the mean over every kept token, as the other
token divergences. α = 0.1 (official ``base_alpha_1 = base_alpha_2``). The official trainer's adaptive α
and the gradual (2 − β, β) weighting of the halves are switched off there (``update_alpha``,
``gradual_beta = False``) and are not implemented. No τ² factor.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import _token_references as _ref
from kdcollapse.losses._catalog import get_loss, register_loss
from kdcollapse.losses._reduce import IGNORE_INDEX, logit_samples
from kdcollapse.losses._shapes import check_positive
from kdcollapse.losses.fused import TeacherHead, TeacherLogits, TopKTeacher, fused_head_loss
from kdcollapse.losses._divergence import Divergence, Parameter
from kdcollapse.losses.llm import _kl, _log_mixture

SKEW = 0.1


def teacher_side_rows(log_q: Tensor, log_p: Tensor, alpha: float = SKEW) -> Tensor:
    """KL(p ‖ α p + (1 − α) q) per row: the loss on the teacher's responses."""
    return _kl(log_p, _log_mixture(log_p, log_q, alpha))


@register_loss("distillm2_student_kl", kind="logits", paper="Ko et al. 2025 (ICML), DistiLLM-2 (the student-response "
               "half)", equation="KL(q ‖ (1−α)p + α sg(q)): skew reverse KL's value, the student's share held fixed",
               temperature=True, sequences=True, ignore_index=False, chunked=True, example=lambda k, y: {"alpha": 0.1},
               divergence=Divergence(parameters={"alpha": Parameter(
                   SKEW, meaning="the student's (fixed) weight in the skewed teacher (official 0.1)")}),
               reference=_ref.distillm2_student_kl)
def student_side_rows(log_q: Tensor, log_p: Tensor, alpha: float = SKEW) -> Tensor:
    """KL(q ‖ (1 − α) p + α sg(q)) per row: the loss on the student's responses."""
    return _kl(log_q, _log_mixture(log_p, log_q.detach(), 1 - alpha))


distillm2_student_kl_loss = get_loss("distillm2_student_kl").function  # (student, teacher, alpha=0.1, temperature, ...)


def distillm2_rows(log_q: Tensor, log_p: Tensor, student_response: Tensor, alpha: float = SKEW) -> Tensor:
    """Each row's half of the objective: ``student_side_rows`` where ``student_response`` (bool per row),
    ``teacher_side_rows`` elsewhere."""
    return torch.where(student_response, student_side_rows(log_q, log_p, alpha), teacher_side_rows(log_q, log_p, alpha))


def check_skew(alpha: float | None) -> float:
    alpha = SKEW if alpha is None else alpha
    if not (isinstance(alpha, (int, float)) and not isinstance(alpha, bool) and 0 <= alpha <= 1):
        raise KdcollapseError(f"alpha of distillm2 (the skew) must be a number in [0, 1], got {alpha!r}")
    return float(alpha)


def _response_rows(student_response: object, lead: tuple[int, ...]) -> Tensor:
    """``student_response`` as a bool tensor of the logits' leading shape; (B,) is spread over T."""
    if not (isinstance(student_response, Tensor) and student_response.dtype == torch.bool):
        raise KdcollapseError(f"student_response must be a bool tensor (True where the student wrote the "
                              f"response), got {type(student_response).__name__}"
                              + (f" of {student_response.dtype}" if isinstance(student_response, Tensor) else ""))
    if len(lead) == 2 and tuple(student_response.shape) == lead[:1]:
        student_response = student_response.unsqueeze(1).expand(lead)
    if tuple(student_response.shape) != lead:
        raise KdcollapseError(f"student_response must have shape {lead} or {lead[:1]} (one flag per sequence), "
                              f"got {tuple(student_response.shape)}")
    return student_response


@register_loss("distillm2", kind="logits", paper="Ko et al. 2025 (ICML), DistiLLM-2: a contrastive approach",
               equation="KL(p ‖ αp + (1−α)q) on teacher responses + KL(q ‖ (1−α)p + α sg(q)) on student responses",
               temperature=True, sequences=True, ignore_index=False, chunked=True,
               example=lambda k, y: {"student_response": y % 2 == 1},
               variants={"skew 0.3, τ 2": lambda k, y: {"student_response": y % 3 == 0, "alpha": 0.3,
                                                        "temperature": 2.0}}, reference=_ref.distillm2)
def distillm2_loss(student: Tensor, teacher: Tensor, student_response: Tensor, alpha: float = SKEW,
                   temperature: float = 1.0, *, mask: Tensor | None = None, reduction: str = "mean",
                   vocab_size: int | None = None, chunk_size: int | None = None,
                   validate: bool | None = None) -> Tensor:
    """DistiLLM-2's objective (module doc) on logits (B, K) or (B, T, K); ``student_response`` (bool, the
    logits' leading shape or (B,) for sequences) marks the positions of the student's own responses.
    ``reduction="sequence"`` ((B, T, K) only) is the official one: the mean over teacher-response sequences of
    their kept-token means plus the same over student-response sequences (a sequence with no kept token is
    left out); other options as :func:`kdcollapse.losses.forward_kl_loss`."""
    alpha = check_skew(alpha)
    check_positive("temperature", temperature)
    sequence = reduction == "sequence"
    samples = logit_samples({"student": student, "teacher": teacher}, mask=mask, vocab_size=vocab_size,
                            validate=validate, reduction="none" if sequence else reduction)
    side = _response_rows(student_response, samples.lead)
    flags = side.reshape(-1) if samples.kept is None else side[samples.kept]
    values = samples.per_row(lambda s, t, f: distillm2_rows(torch.log_softmax(s / temperature, -1),
                                                            torch.log_softmax(t / temperature, -1), f, alpha),
                             flags, chunk_size=chunk_size)
    if not sequence:
        return samples.reduce(values, reduction)
    if len(samples.lead) != 2:
        raise KdcollapseError(f"reduction='sequence' needs (B, T, K) logits, got shape {tuple(student.shape)}")
    per_token = samples.reduce(values, "none")
    keep = torch.ones(samples.lead, dtype=torch.bool) if mask is None else mask.bool()
    counts = keep.sum(1)
    means = per_token.sum(1) / counts.clamp_min(1)
    by_sequence = side[:, 0]
    if not bool((side == by_sequence.unsqueeze(1)).all()):
        raise KdcollapseError("reduction='sequence' needs one student_response flag per sequence")
    total = means.new_zeros(())
    for half in (~by_sequence, by_sequence):
        counted = half & (counts > 0)
        if counted.any():
            total = total + means[counted].mean()
    return total


def _teacher_rows(teacher, index: Tensor):
    if isinstance(teacher, TeacherLogits):
        return TeacherLogits(teacher.logits[index])
    if isinstance(teacher, TeacherHead):
        return TeacherHead(teacher.hidden[index], teacher.weight)
    return TopKTeacher(teacher.log_probs_topk[index], teacher.indices[index], teacher.log_rest[index],
                       teacher.temperature, teacher.tail)


@register_loss("distillm2_fused", kind="tokens", paper="Ko et al. 2025 (ICML), DistiLLM-2; fused as Liger-Kernel's "
               "linear losses", equation="skew KL on teacher-response rows + KL(q ‖ (1−α)p + α sg(q)) on student-response "
               "rows, z = h Wᵀ chunk by chunk", temperature=True, sequences=True, ignore_index=True, chunked=True,
               compiles=False,
               inputs=lambda: (torch.randn(6, 4, dtype=torch.float64, requires_grad=True),
                               torch.randn(5, 4, dtype=torch.float64, requires_grad=True),
                               TeacherLogits(torch.randn(6, 5, dtype=torch.float64)),
                               torch.tensor([False, True, False, True, True, False])),
               reference=_ref.distillm2_fused)
def distillm2_fused_loss(hidden: Tensor, weight: Tensor, teacher: TeacherLogits | TeacherHead | TopKTeacher,
                         student_response: Tensor, alpha: float = SKEW, temperature: float = 1.0, *,
                         labels: Tensor | None = None, ce_weight: float = 0.0, distill_weight: float = 1.0,
                         mask: Tensor | None = None, ignore_index: int = IGNORE_INDEX,
                         chunk_size: int = 1024) -> Tensor:
    """DistiLLM-2's objective fused with the student's head (no (N, V) tensor): :func:`fused_head_loss` with
    ``skew_forward_kl`` on the rows of teacher responses (plus ``ce_weight``·CE there, when ``labels``) and
    ``distillm2_student_kl`` on the rows where ``student_response`` (N,) is True, the mean over every kept
    row of both, as ``distillm2_loss(..., reduction="mean")`` on the logits ``hidden @ weight.T``."""
    n = hidden.shape[0]
    if not (isinstance(student_response, Tensor) and student_response.dtype == torch.bool
            and tuple(student_response.shape) == (n,)):
        raise KdcollapseError(f"student_response must be a bool tensor of shape ({n},), got "
                              f"{tuple(getattr(student_response, 'shape', ()))}")
    keep = torch.ones(n, dtype=torch.bool, device=hidden.device) if mask is None else mask.bool()
    if labels is not None:
        keep = keep & (labels != ignore_index)
    total, count = hidden.new_zeros((), dtype=torch.promote_types(hidden.dtype, torch.float32)), 0
    for rows, divergence, ce in ((~student_response, "skew_forward_kl", ce_weight),
                                 (student_response, "distillm2_student_kl", 0.0)):
        kept = int((keep & rows).sum())
        if not kept:
            continue
        index = rows.nonzero().squeeze(1)
        part = fused_head_loss(hidden[index], weight, _teacher_rows(teacher, index), divergence, temperature,
                               labels=None if labels is None else labels[index], ce_weight=ce,
                               distill_weight=distill_weight, mask=keep[index], ignore_index=ignore_index,
                               chunk_size=chunk_size, alpha=alpha)
        total, count = total + kept * part, count + kept
    if not count:
        raise KdcollapseError("no token is kept (every position masked or labelled ignore_index)")
    return total / count
