"""Sequence logits with masks, bad input and the nn.Module wrappers, across every declared loss."""

import inspect

import pytest
import torch

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError
from loss_cases import labelled, logit_cases, other_losses

K = 5
TABLE = torch.softmax(torch.randn(K, K), -1)


def as_fn(info, case):
    """The loss as f(fitted side, reference side, target, mask)."""
    return lambda a, b, y, mask: info.call(a, b, y, mask, case)


@pytest.mark.parametrize("info,case", logit_cases(lambda info, case: info.sequences))
def test_sequence_logits_with_mask_are_samples(info, case):
    loss_fn = as_fn(info, case)
    b, steps = 3, 4
    a, c = (3 * torch.randn(2, b, steps, K)).unbind()
    a, c = a.requires_grad_(), c.requires_grad_()
    y, mask = torch.randint(0, K, (b, steps)), torch.rand(b, steps) < 0.5
    mask[1, 2] = True
    loss = loss_fn(a, c, y, mask)
    flat = loss_fn(a[mask], c[mask], y[mask], None)
    torch.testing.assert_close(loss, flat)
    g_a, g_c = torch.autograd.grad(loss, (a, c), allow_unused=True, materialize_grads=True)
    assert g_a[~mask].eq(0).all() and g_c[~mask].eq(0).all()
    assert g_a[mask].abs().sum() > 0
    unmasked = loss_fn(a, c, y, None)
    flat_all = loss_fn(a.reshape(-1, K), c.reshape(-1, K), y.reshape(-1), None)
    torch.testing.assert_close(unmasked, flat_all)


# --- bad input --------------------------------------------------------------------------------

def _two(shape=(4, K)):
    return torch.randn(*shape), torch.randn(*shape)


@pytest.mark.parametrize("info,case", logit_cases())
def test_every_logit_loss_rejects_bad_input(info, case):
    loss_fn = as_fn(info, case)
    a, c = _two()
    y = torch.randint(0, K, (4,))
    with pytest.raises(KdcollapseError, match=r"K = [57] classes, .* K = [57]"):
        loss_fn(a, torch.randn(4, 7), y, None)
    with pytest.raises(KdcollapseError, match="floating-point"):
        loss_fn(a.long(), c, y, None)
    bad = c.clone()
    bad[1, 2] = float("nan")
    with pytest.raises(KdcollapseError, match="contains NaN or inf"):
        loss_fn(a, bad, y, None)
    bad[1, 2] = float("inf")
    with pytest.raises(KdcollapseError, match="contains NaN or inf"):
        loss_fn(bad, a, y, None)
    with pytest.raises(KdcollapseError, match="2 or 3 dimensions" if info.sequences else "dimensions"):
        loss_fn(a[0], c[0], y, None)
    if not info.sequences:
        return
    with pytest.raises(KdcollapseError, match=r"mask must be a bool or integer \(0/1\) tensor of shape"):
        loss_fn(a, c, y, torch.ones(4))
    with pytest.raises(KdcollapseError, match="mask selects no positions"):
        loss_fn(a, c, y, torch.zeros(4, dtype=torch.bool))


@pytest.mark.parametrize("info,case", logit_cases(lambda info, case: labelled(case)))
def test_target_is_validated(info, case):
    loss_fn = as_fn(info, case)
    a, c = _two()
    with pytest.raises(KdcollapseError, match=r"labels outside \[0, 5\)"):
        loss_fn(a, c, torch.tensor([0, 1, 5, 2]), None)
    with pytest.raises(KdcollapseError, match=r"labels outside \[0, 5\)"):
        loss_fn(a, c, torch.tensor([0, -1, 3, 2]), None)
    with pytest.raises(KdcollapseError, match="integer tensor of class indices"):
        loss_fn(a, c, torch.zeros(4), None)
    with pytest.raises(KdcollapseError, match=r"target must have shape \(4,\)"):
        loss_fn(a, c, torch.zeros(3, dtype=torch.long), None)


@pytest.mark.parametrize("info", other_losses(lambda info: info.checks_values))
def test_every_other_loss_rejects_nan(info):
    inputs = list(info.inputs())
    inputs[0] = inputs[0].clone()
    inputs[0].view(-1)[1] = float("nan")
    with pytest.raises(KdcollapseError, match="contains NaN or inf"):
        info.function(*inputs)


def test_mixed_dtypes():
    a, c, y = *_two(), torch.randint(0, K, (4,))
    table = TABLE.double()  # a class-weight table accumulated in float64, float32 logits
    torch.testing.assert_close(L.ikl_loss(a, c, class_weights=table, target=y),
                               L.ikl_loss(a, c, class_weights=TABLE, target=y))
    assert L.ikl_loss(a.half().float(), c.half(), mse_weight=2.0).dtype == torch.float32


def test_finite_values_whose_sum_overflows_are_accepted():
    huge = torch.full((4, K), 3e38)  # finite, but the float32 sum is inf
    assert torch.isfinite(L.binary_kl_norm_loss(huge, huge))


def test_specific_errors():
    a, c = _two((4, 2))
    with pytest.raises(KdcollapseError, match="needs K >= 3 classes .* got K = 2"):
        L.dkd_loss(a, c, torch.zeros(4, dtype=torch.long))
    a, c = _two()
    with pytest.raises(KdcollapseError, match="temperature must be > 0"):
        L.kd_loss(a, c, 0.0)
    with pytest.raises(KdcollapseError, match="class_weights needs target"):
        L.ikl_loss(a, c, class_weights=TABLE)
    with pytest.raises(KdcollapseError, match=r"class_weights must be a \(5, 5\) tensor"):
        L.ikl_loss(a, c, class_weights=TABLE[:3], target=torch.zeros(4, dtype=torch.long))
    with pytest.raises(KdcollapseError, match=r"shapes differ: student \(4, 5\) vs teacher \(3, 5\)"):
        L.kd_loss(a, c[:3])
    with pytest.raises(KdcollapseError, match="batch sizes differ"):
        L.rkd_loss(torch.randn(4, 3), torch.randn(5, 3))
    x = torch.randn(3, 4)
    with pytest.raises(KdcollapseError, match=r"negatives must have shape \(B, m, d\) = \(3, m, 4\)"):
        L.intra_class_contrastive_loss(x, x, torch.randn(3, 2, 5))
    with pytest.raises(KdcollapseError, match="positives must have the anchors' shape"):
        L.intra_class_contrastive_loss(x, x[:2], torch.randn(3, 2, 4))
    with pytest.raises(KdcollapseError, match=r"negative_mask must be a bool tensor of shape \(3, 2\)"):
        L.intra_class_contrastive_loss(x, x, torch.randn(3, 2, 4), torch.ones(3, 2))
    with pytest.raises(KdcollapseError, match="anchors contains NaN"):
        L.intra_class_contrastive_loss(x / 0 * 0, x, torch.randn(3, 2, 4))
    # no negatives at all is allowed: only the positive in the denominator, loss 0
    assert L.intra_class_contrastive_loss(x, x, torch.randn(3, 0, 4)).item() == 0.0


# --- wrappers ---------------------------------------------------------------------------------

WRAPPERS = [name for name in L.__all__ if inspect.isclass(getattr(L, name))
            and issubclass(getattr(L, name), L.LossModule) and name != "LossModule"]


def test_wrapper_hyperparameters_are_the_functions_number_and_string_options():
    assert list(L.KDLoss.hyperparameters.parameters) == ["temperature", "reduction"]
    assert list(L.DKDLoss.hyperparameters.parameters) == ["alpha", "beta", "temperature",
                                                          "ignore_index", "reduction"]


@pytest.mark.parametrize("name", WRAPPERS)
def test_wrapper_stores_hyperparameters(name):
    cls = getattr(L, name)
    fn, hyper = cls.loss_fn, list(cls.hyperparameters.parameters)
    options = inspect.signature(fn).parameters
    assert hyper == [p for p in options if type(options[p].default) in (int, float, str)]
    defaults = {p: inspect.signature(fn).parameters[p].default for p in hyper}
    assert cls().config == defaults
    values = [1.5 + i for i in range(len(hyper))]
    assert cls(*values).config == dict(zip(hyper, values))
    assert f"{hyper[0]}=1.5" in repr(cls(*values))
    with pytest.raises(TypeError):
        cls(*values, 9.0)


def test_wrappers_call_their_functions():
    a, c, y = *_two(), torch.randint(0, K, (4,))
    torch.testing.assert_close(L.KDLoss(3.0)(a, c), L.kd_loss(a, c, 3.0))
    torch.testing.assert_close(L.DKDLoss(beta=2.0)(a, c, y), L.dkd_loss(a, c, y, beta=2.0))
    torch.testing.assert_close(L.IKLLoss(mse_weight=4.0)(a, c, class_weights=TABLE, target=y),
                               L.ikl_loss(a, c, class_weights=TABLE, target=y, mse_weight=4.0))
    torch.testing.assert_close(L.IKLATLoss(3.0, 1.0)(a, c, y, TABLE),
                               L.ikl_at_loss(a, c, y, TABLE, 3.0, 1.0))
    e, f = torch.randn(6, 3), torch.randn(6, 4)
    torch.testing.assert_close(L.RKDLoss(1.0, 2.0)(e, f), L.rkd_loss(e, f, 1.0, 2.0))
