"""Causal language models: align each position's logits with the next token's label."""

from __future__ import annotations

from typing import NamedTuple

from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses._reduce import IGNORE_INDEX, check_mask, check_target
from kdcollapse.losses._shapes import check_tensor


class CausalLMBatch(NamedTuple):
    """Shifted logits (B, T − 1, V), next-token labels (B, T − 1) and the positions to use."""

    student: Tensor
    teacher: Tensor | None
    labels: Tensor
    mask: Tensor


def shift_for_causal_lm(student_logits: Tensor, teacher_logits: Tensor | None, labels: Tensor,
                        mask: Tensor | None = None, *,
                        ignore_index: int = IGNORE_INDEX) -> CausalLMBatch:
    """Pair the logits at position t with the label at t + 1, as Hugging Face causal LMs do.

    ``student_logits``/``teacher_logits`` (B, T, V) (the teacher may be None), ``labels`` (B, T)
    with ``ignore_index`` where there is nothing to predict, ``mask`` (B, T) bool or 0/1 (an
    attention mask; None = every position). The returned ``mask`` (B, T − 1, bool) keeps a position
    when its next token is attended and labelled, so label-free losses (``kd_loss``) skip the same
    positions as label-taking ones. The logits are views; nothing is copied.
    """
    check_tensor("student_logits", student_logits, (3,))
    lead = tuple(student_logits.shape[:-1])
    if lead[1] < 2:
        raise KdcollapseError(f"shift_for_causal_lm needs T >= 2 positions, got shape "
                              f"{tuple(student_logits.shape)}")
    if teacher_logits is not None:
        check_tensor("teacher_logits", teacher_logits, (3,))
        if tuple(teacher_logits.shape[:-1]) != lead:
            raise KdcollapseError(f"teacher_logits must have the student's (B, T) = {lead}, got "
                                  f"shape {tuple(teacher_logits.shape)}")
    keep = check_target(labels, lead)[:, 1:] != ignore_index
    if mask is not None:
        keep = keep & check_mask(mask, lead)[:, 1:].bool()
    teacher = None if teacher_logits is None else teacher_logits[:, :-1]
    return CausalLMBatch(student_logits[:, :-1], teacher, labels[:, 1:], keep)
