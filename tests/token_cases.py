"""What the token-loss tests share (tests/test_losses_divergences.py, _abkd.py, _akl.py, _distillm2.py): float64
logits with ignored positions, and a fused-head case (a student's hidden states and head, a teacher in each of
its three forms) with the check that a fused loss equals its unfused expression in value and gradients."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

import kdcollapse.losses as L

FORMS = ("logits", "head", "top-k with k = V")  # the teacher's forms a fused loss takes


def token_logits(vocab: int, seed: int = 0, scale: float = 2.0, batch: int = 3, length: int = 4):
    """Student and teacher logits (batch, length, vocab) in float64, requiring gradients, and labels with
    positions (0, 1) and (2, 3) ignored (-100)."""
    g = torch.Generator().manual_seed(seed)
    s, t = (scale * torch.randn(2, batch, length, vocab, generator=g, dtype=torch.float64)).unbind()
    labels = torch.randint(0, vocab, (batch, length), generator=g)
    labels[0, 1] = labels[2, 3] = -100
    return s.requires_grad_(), t.requires_grad_(), labels


def kept_probabilities(s: Tensor, t: Tensor, temperature: float, keep: Tensor):
    """For each kept position (b, i) of logits (B, T, V): the student's and the teacher's probabilities at
    ``temperature``, written out (exp over the sum of exps), for the references' token-at-a-time loops."""
    for b in range(s.shape[0]):
        for i in range(s.shape[1]):
            if keep[b, i]:
                yield (torch.exp(s[b, i] / temperature) / torch.exp(s[b, i] / temperature).sum(),
                       torch.exp(t[b, i] / temperature) / torch.exp(t[b, i] / temperature).sum())


@dataclass
class HeadCase:
    """``n`` tokens: the student's hidden states (n, h) and head (v, h), both requiring gradients; the teacher's
    hidden states (n, 4) and head (v, 4); labels with some positions ignored (-100)."""

    hidden: Tensor
    weight: Tensor
    t_hidden: Tensor
    t_weight: Tensor
    labels: Tensor

    @property
    def vocab(self) -> int:
        return self.weight.shape[0]

    @property
    def keep(self) -> Tensor:
        return self.labels != -100

    @property
    def teacher_logits(self) -> Tensor:
        return self.t_hidden @ self.t_weight.T

    @property
    def student_logits(self) -> Tensor:
        return self.hidden @ self.weight.T

    def teacher(self, form: str, temperature: float):
        """The teacher in ``form`` (one of :data:`FORMS`; the top-k one stored at ``temperature``)."""
        if form == "logits":
            return L.TeacherLogits(self.teacher_logits)
        if form == "head":
            return L.TeacherHead(self.t_hidden, self.t_weight)
        return L.TopKTeacher.from_logits(self.teacher_logits, self.vocab, temperature)


def head_case(n: int, ignored: list[int], seed: int = 6, h: int = 5, v: int = 11) -> HeadCase:
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g, dtype=torch.float64).requires_grad_()
    weight = torch.randn(v, h, generator=g, dtype=torch.float64).requires_grad_()
    t_hidden, t_weight = (torch.randn(n, 4, generator=g, dtype=torch.float64),
                          torch.randn(v, 4, generator=g, dtype=torch.float64))
    labels = torch.randint(0, v, (n,), generator=g)
    labels[ignored] = -100
    return HeadCase(hidden, weight, t_hidden, t_weight, labels)


def assert_fused_equals(fused: Callable[[int], Tensor], expected: Tensor, case: HeadCase) -> None:
    """``fused(chunk_size)`` equals ``expected`` (computed from ``case``'s student) in value and in the gradients
    of the student's hidden states and head, in chunks of 4 tokens and in one chunk, to float64 rounding."""
    params = (case.hidden, case.weight)
    want = (expected.detach(), *torch.autograd.grad(expected, params))
    for chunk in (4, 64):
        loss = fused(chunk)
        got = (loss.detach(), *torch.autograd.grad(loss, params))
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
