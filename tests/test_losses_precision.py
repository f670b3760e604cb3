"""Half-precision inputs: every loss accumulates in float32 and gives the float64 answer.

The reference is the same loss on the same bf16/fp16-rounded values upcast to float64 (the float64
path is itself tested against slow references in test_losses*.py), so the only difference left is
the precision of the computation. Computing in the input dtype, as before, was off by up to 201 %.
"""

import pytest
import torch

import kdcollapse.losses as L
from loss_cases import logit_cases, other_losses

HALF = [torch.bfloat16, torch.float16]


def _check(loss_fn, inputs, dtype):
    """Value within 1e-3 of float64 (the issue asks for 1 %), float32 result, gradients in the
    inputs' dtype and close to the float64 ones."""
    low = [x.to(dtype).requires_grad_() for x in inputs]
    exact = [x.detach().double().requires_grad_() for x in low]
    value, reference = loss_fn(*low), loss_fn(*exact)
    assert value.dtype == torch.float32
    assert abs(value.item() - reference.item()) <= 1e-3 * abs(reference.item()), \
        (value.item(), reference.item())
    grads = torch.autograd.grad(value, low, allow_unused=True)
    for x, g, g_ref in zip(low, grads, torch.autograd.grad(reference, exact, allow_unused=True)):
        if g_ref is None:  # the RKD teacher side
            assert g is None
            continue
        assert g.dtype == x.dtype
        scale = g_ref.abs().max().item()
        torch.testing.assert_close(g.double(), g_ref, rtol=2e-2, atol=1e-2 * scale)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("k", [10, 1000, 32000])  # K² tables: 8 MB at K = 1000
@pytest.mark.parametrize("student_near_teacher", [False, True], ids=["far", "near"])
@pytest.mark.parametrize("info,case", logit_cases())
def test_logit_losses_in_half_precision_match_float64(info, case, student_near_teacher, k, dtype):
    """"near" (student = teacher + small noise, as late in distillation) is where computing in bf16
    failed worst: KD and DKD −201 % at K = 32,000, BinaryKL-Norm +70-84 %."""
    torch.manual_seed(k)
    n = 4 if k == 32000 else 8
    teacher = 3 * torch.randn(n, k)
    student = teacher + (0.3 if student_near_teacher else 3.0) * torch.randn(n, k)
    if k == 32000 and case.k_squared:
        pytest.skip("a K×K table or Gram matrix at K = 32,000 is 8 GB; K = 1000 covers the path")
    y = torch.randint(0, k, (n,))
    _check(lambda s, t: info.call(s, t, y, None, case), [student, teacher], dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
@pytest.mark.parametrize("info", other_losses())
def test_other_losses_in_half_precision_match_float64(info, dtype):
    inputs = info.inputs()
    floats = [i for i, x in enumerate(inputs) if torch.is_tensor(x) and x.is_floating_point()]  # not a teacher object

    def loss_fn(*xs):
        args = list(inputs)
        for i, x in zip(floats, xs):
            args[i] = x
        return info.function(*args)

    _check(loss_fn, [inputs[i] for i in floats], dtype)


@pytest.mark.parametrize("dtype", HALF, ids=str)
def test_embedding_losses_at_a_low_temperature_in_half_precision(dtype):
    torch.manual_seed(0)
    _check(L.rkd_loss, [torch.randn(12, 16), torch.randn(12, 24)], dtype)
    _check(lambda a, p, n: L.intra_class_contrastive_loss(a, p, n, temperature=0.1),
           [torch.randn(6, 32), torch.randn(6, 32), torch.randn(6, 5, 32)], dtype)


def test_float64_stays_float64_and_mixed_inputs_promote():
    s, t = torch.randn(3, 7, dtype=torch.float64), torch.randn(3, 7)
    assert L.kd_loss(s, t).dtype == torch.float64
    assert L.kd_loss(s.float(), t.bfloat16()).dtype == torch.float32
