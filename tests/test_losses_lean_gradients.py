"""The lean gradients of ``kd_loss`` and ``dkd_loss`` for a frozen teacher (issue 28, item 5): custom autograd
functions that keep one (N, K) tensor or none instead of every intermediate. Their values and student
gradients must equal the plain autograd computation (the path a teacher with a gradient takes, which the
official-code tests in test_losses.py pin down) in float64 to 1e-14 (relative and absolute), for every
input form."""

from __future__ import annotations

import pytest
import torch

from kdcollapse.losses import dkd_loss, kd_loss

LOSSES = {
    "kd": lambda s, t, y, **kw: kd_loss(s, t, 2.0, **kw),
    "dkd": lambda s, t, y, **kw: dkd_loss(s, t, y, 1.5, 8.0, 2.0, **kw),
}
FORMS = {  # name -> (leading shape, keyword arguments given the target)
    "rows": ((37,), lambda y: {}),
    "sequences, masked": ((3, 11), lambda y: {"mask": torch.arange(y.numel()).reshape(y.shape) % 3 > 0}),
    "sequences, sum": ((3, 11), lambda y: {"reduction": "sum"}),
    "sequences, none": ((3, 11), lambda y: {"reduction": "none"}),
    "chunked": ((37,), lambda y: {"chunk_size": 5}),
}


def _inputs(lead, k=13, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    student = (4 * torch.randn(*lead, k, generator=g, dtype=torch.float64)).to(dtype)
    teacher = (4 * torch.randn(*lead, k, generator=g, dtype=torch.float64)).to(dtype)
    return student, teacher, torch.randint(0, k, lead, generator=g)


@pytest.mark.parametrize("form", FORMS)
@pytest.mark.parametrize("loss", LOSSES)
def test_lean_gradient_equals_autograd_in_float64(loss, form):
    lead, kwargs = FORMS[form]
    student, teacher, target = _inputs(lead)
    options = kwargs(target)
    s1, s2 = student.clone().requires_grad_(), student.clone().requires_grad_()
    lean = LOSSES[loss](s1, teacher, target, **options)  # frozen teacher: the custom function
    plain = LOSSES[loss](s2, teacher.clone().requires_grad_(), target, **options)  # autograd through every step
    weights = torch.linspace(0.5, 2.0, lean.numel(), dtype=torch.float64).reshape(lean.shape)
    (g1,) = torch.autograd.grad((lean * weights).sum(), s1)
    (g2,) = torch.autograd.grad((plain * weights).sum(), s2)
    torch.testing.assert_close(lean, plain.detach(), rtol=1e-14, atol=1e-14)
    torch.testing.assert_close(g1, g2, rtol=1e-14, atol=1e-14)


@pytest.mark.parametrize("loss", LOSSES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lean_gradient_keeps_the_student_dtype_and_survives_a_second_backward(loss, dtype):
    student, teacher, target = _inputs((9,), dtype=dtype)
    student.requires_grad_()
    value = LOSSES[loss](student, teacher, target)
    assert value.dtype == torch.float32
    (first,) = torch.autograd.grad(value, student, retain_graph=True)
    (second,) = torch.autograd.grad(value, student)  # the saved tensors were not changed in place
    assert first.dtype == dtype and torch.equal(first, second)
    exact_student = student.detach().double().requires_grad_()
    (exact,) = torch.autograd.grad(LOSSES[loss](exact_student, teacher.double(), target), exact_student)
    torch.testing.assert_close(first.double(), exact, rtol=0, atol=1e-6 if dtype == torch.float32 else 2e-3)
