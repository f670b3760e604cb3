"""The LLM path: ignore_index, 0/1 masks, reductions, validation off (torch.compile), vocabulary
slicing, row chunking and the causal-LM shift, across every declared logit loss."""

import functools

import pytest
import torch
import torch.nn.functional as F

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError
from loss_cases import labelled, logit_cases, other_losses, takes

K = 6
SEQUENCE_CASES = logit_cases(lambda info, case: info.sequences)


def as_fn(info, case):
    """The loss as f(fitted side, reference side, target, mask, **options)."""
    return lambda a, b, y, m, **o: info.call(a, b, y, m, case, **o)


def batch(b=3, steps=5, k=K, seed=0):
    """Sequence logits (both requiring grad), labels with -100, an int64 attention mask."""
    g = torch.Generator().manual_seed(seed)
    a, c = (3 * torch.randn(2, b, steps, k, generator=g, dtype=torch.float64)).unbind()
    y = torch.randint(0, k, (b, steps), generator=g)
    y[0, 1] = y[2, 4] = -100
    mask = torch.ones(b, steps, dtype=torch.long)
    mask[1, 3:] = 0
    return a.requires_grad_(), c.requires_grad_(), y, mask


def kept(y, mask, case):
    keep = mask.bool()
    return keep & (y != -100) if labelled(case) else keep


def value_and_grads(fn, a, c):
    value = fn()
    scalar = value.sum() if value.dim() else value
    return (value, *torch.autograd.grad(scalar, (a, c), materialize_grads=True))


# --- ignore_index, integer masks, reductions --------------------------------------------------

@pytest.mark.parametrize("info,case", SEQUENCE_CASES)
def test_ignored_labels_and_int_masks_are_dropped_positions(info, case):
    loss_fn, (a, c, y, mask) = as_fn(info, case), batch()
    keep = kept(y, mask, case)
    value = loss_fn(a, c, y, mask)  # -100 labels, also outside the mask, are no error
    torch.testing.assert_close(value, loss_fn(a[keep], c[keep], y[keep], None))
    torch.testing.assert_close(value, loss_fn(a, c, y, keep))
    g_a, g_c = torch.autograd.grad(value, (a, c), materialize_grads=True)
    assert g_a[~keep].eq(0).all() and g_c[~keep].eq(0).all()


@pytest.mark.parametrize("info,case", logit_cases(lambda info, case: info.ignore_index and labelled(case)))
def test_ignore_index_is_configurable_and_labels_are_checked_where_kept(info, case):
    loss_fn, (a, c, y, mask) = as_fn(info, case), batch()
    y_custom = y.masked_fill(y == -100, K + 3)  # an out-of-range sentinel, dropped by ignore_index
    torch.testing.assert_close(loss_fn(a, c, y_custom, mask, ignore_index=K + 3),
                               loss_fn(a, c, y, mask))
    with pytest.raises(KdcollapseError, match=r"labels outside \[0, 6\)"):
        loss_fn(a, c, y_custom, mask)
    y[1, 4] = 99  # under mask 0: not checked
    loss_fn(a, c, y, mask)
    with pytest.raises(KdcollapseError, match="every label is ignore_index"):
        loss_fn(a, c, torch.full_like(y, -100), None)


def test_integer_masks_must_be_zero_or_one():
    a, c, y, mask = batch()
    mask[0, 0] = 2
    with pytest.raises(KdcollapseError, match="must hold only 0 and 1"):
        L.kd_loss(a, c, mask=mask)
    with pytest.raises(KdcollapseError, match=r"mask must be a bool or integer \(0/1\) tensor"):
        L.kd_loss(a, c, mask=mask.double())


@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("info,case", SEQUENCE_CASES)
def test_reductions(info, case, validate):
    loss_fn, (a, c, y, mask) = as_fn(info, case), batch()
    keep = kept(y, mask, case)
    per_position = loss_fn(a, c, y, mask, reduction="none", validate=validate)
    assert per_position.shape == (3, 5) and per_position[~keep].eq(0).all()
    assert per_position[keep].abs().min() > 0
    torch.testing.assert_close(per_position.sum(), loss_fn(a, c, y, mask, reduction="sum"))
    torch.testing.assert_close(per_position.sum() / keep.sum(), loss_fn(a, c, y, mask))
    for i, j in [(0, 0), (2, 2)]:  # a per-position value is the loss of that row alone
        torch.testing.assert_close(per_position[i, j],
                                   loss_fn(a[i, j:j + 1], c[i, j:j + 1], y[i, j:j + 1], None))
    with pytest.raises(KdcollapseError, match="reduction must be one of mean, sum, none"):
        loss_fn(a, c, y, mask, reduction="avg")


def test_embedding_loss_reductions():
    e_s, e_t = torch.randn(5, 4, dtype=torch.float64), torch.randn(5, 3, dtype=torch.float64)
    per_anchor = L.rkd_loss(e_s, e_t, reduction="none")
    assert per_anchor.shape == (5,)
    torch.testing.assert_close(per_anchor.mean(), L.rkd_loss(e_s, e_t))
    torch.testing.assert_close(per_anchor.sum(), L.rkd_loss(e_s, e_t, reduction="sum"))
    anchors, positives = torch.randn(2, 4, 8, dtype=torch.float64).unbind()
    negatives = torch.randn(4, 3, 8, dtype=torch.float64)
    values = L.intra_class_contrastive_loss(anchors, positives, negatives, reduction="none")
    for i in range(4):
        torch.testing.assert_close(values[i], L.intra_class_contrastive_loss(
            anchors[i:i + 1], positives[i:i + 1], negatives[i:i + 1]))
    torch.testing.assert_close(values.sum(), L.intra_class_contrastive_loss(
        anchors, positives, negatives, reduction="sum"))


def test_wrappers_take_ignore_index_and_reduction():
    a, c, y, mask = batch()
    y = y.clamp_min(0)
    torch.testing.assert_close(L.DKDLoss(reduction="none", ignore_index=7)(a, c, y, mask=mask),
                               L.dkd_loss(a, c, y, mask=mask, reduction="none", ignore_index=7))


# --- validation off: same numbers, no host synchronisation, fullgraph compile ------------------

@pytest.mark.parametrize("info,case", SEQUENCE_CASES)
def test_unvalidated_path_gives_the_validated_values_and_gradients(info, case):
    loss_fn, (a, c, y, mask) = as_fn(info, case), batch()
    checked = value_and_grads(lambda: loss_fn(a, c, y, mask), a, c)
    with L.validation(False):
        unchecked = value_and_grads(lambda: loss_fn(a, c, y, mask), a, c)
    for x, x_ref in zip(unchecked, checked):
        torch.testing.assert_close(x, x_ref)
    nan = a.detach().clone()
    nan[0, 0, 0] = float("nan")
    assert torch.isnan(loss_fn(nan, c, y, mask, validate=False))  # really unchecked
    with L.validation(False):  # the keyword wins over the block
        with pytest.raises(KdcollapseError, match="contains NaN"):
            loss_fn(nan, c, y, mask, validate=True)


def test_fullgraph_compile_traces_every_loss():
    """Dynamo traces each declared loss (forward and backward, aot_eager backend) in one graph with
    checks off (a loss declared ``compiles=False`` says why not); with them on it cannot (the
    read-back breaks the graph). Inductor is not used here: it compiles C++ for a minute per loss
    on the test machine."""
    a, c, y, mask = batch()
    a32, c32 = a.detach().float().requires_grad_(), c.detach().float()
    calls = {}
    for p in SEQUENCE_CASES:
        info, case = p.values
        pair, arguments = info.arguments(a32, c32, y, case)
        if info.compiles and case is info.cases[0]:  # one case per loss keeps this test cheap
            calls[p.id] = (functools.partial(info.function, mask=mask, **arguments), pair)
    for p in other_losses(lambda info: info.compiles):
        first, *rest = p.values[0].inputs()
        rest = (x.float() if x.is_floating_point() else x for x in rest)
        calls[p.id] = (p.values[0].function, (first.float().requires_grad_(), *rest))
    torch._dynamo.reset()
    # the losses share code (logit_samples, per_row), traced once per loss: more than 8 recompiles
    with L.validation(False), torch._dynamo.config.patch(recompile_limit=64):
        for name, (fn, args) in calls.items():
            value = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
            torch.testing.assert_close(value, fn(*args), msg=name)
            value.backward()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="(?i)unsupported|graph break|data-dependent"):
        torch.compile(L.kd_loss, fullgraph=True, backend="aot_eager")(a32, c32)


# --- vocabulary slicing ----------------------------------------------------------------------

@pytest.mark.parametrize("info,case", logit_cases(
    lambda info, case: takes(info, "vocab_size") and not case.k_squared))
def test_padded_vocabularies_need_an_explicit_vocab_size(info, case):
    loss_fn, (a, c, y, mask) = as_fn(info, case), batch(k=8)
    y = y.clamp_max(K - 1)
    padded = torch.cat([c, torch.randn(3, 5, 4, dtype=torch.float64)], -1)  # teacher V = 12
    with pytest.raises(KdcollapseError, match=r"K = (8|12) classes, .* K = (8|12) \(padded vocabularies: "
                                              r"pass vocab_size="):
        loss_fn(a, padded, y, mask)
    torch.testing.assert_close(loss_fn(a, padded, y, mask, vocab_size=K),
                               loss_fn(a[..., :K], c[..., :K], y, mask))
    with pytest.raises(KdcollapseError, match="vocab_size must be an int in"):
        loss_fn(a, padded, y, mask, vocab_size=9)
    s, t = L.slice_vocab({"student": a, "teacher": padded}, 8).values()
    assert s.shape[-1] == t.shape[-1] == 8 and torch.equal(t, c)


# --- chunked rows ----------------------------------------------------------------------------

@pytest.mark.parametrize("validate", [True, False])
@pytest.mark.parametrize("info,case", logit_cases(lambda info, case: info.chunked))
def test_chunked_rows_equal_unchunked(info, case, validate):
    loss_fn, (a, c, y, mask) = as_fn(info, case), batch(b=4, steps=5, k=50)
    for reduction in ("mean", "none"):
        whole = value_and_grads(lambda: loss_fn(a, c, y, mask, reduction=reduction,
                                                validate=validate), a, c)
        chunked = value_and_grads(lambda: loss_fn(a, c, y, mask, reduction=reduction,
                                                  validate=validate, chunk_size=3), a, c)
        for x, x_ref in zip(chunked, whole):
            torch.testing.assert_close(x, x_ref, rtol=1e-6, atol=1e-6)
            assert x.dtype == x_ref.dtype
    with pytest.raises(KdcollapseError, match="chunk_size must be a positive int"):
        loss_fn(a, c, y, mask, chunk_size=0)


def test_chunked_half_precision_gradients_keep_the_input_dtype():
    s = torch.randn(10, 300, dtype=torch.bfloat16, requires_grad=True)
    t = torch.randn(10, 300, dtype=torch.bfloat16)
    y = torch.randint(0, 300, (10,))
    value = L.dkd_loss(s, t, y, chunk_size=4)
    assert value.dtype == torch.float32
    (grad,) = torch.autograd.grad(value, s)
    (grad_ref,) = torch.autograd.grad(L.dkd_loss(s, t, y), s)
    assert grad.dtype == torch.bfloat16 and torch.equal(grad, grad_ref)


# --- causal-LM shift -------------------------------------------------------------------------

def test_shift_for_causal_lm_pairs_position_t_with_label_t_plus_1():
    a, c, y, mask = batch(steps=6)
    shifted = L.shift_for_causal_lm(a, c, y, mask)
    assert shifted.student.shape == (3, 5, K) and shifted.labels.shape == (3, 5)
    assert torch.equal(shifted.labels, y[:, 1:]) and torch.equal(shifted.student, a[:, :-1])
    assert torch.equal(shifted.mask, mask[:, 1:].bool() & (y[:, 1:] != -100))
    # Hugging Face's causal-LM loss is the cross-entropy on exactly these pairs
    hf = F.cross_entropy(a[:, :-1].reshape(-1, K), y[:, 1:].masked_fill(mask[:, 1:] == 0, -100)
                         .reshape(-1), ignore_index=-100)
    keep = shifted.mask
    torch.testing.assert_close(F.cross_entropy(shifted.student[keep], shifted.labels[keep]), hf)
    loops = [L.kd_loss(a[b, t:t + 1], c[b, t:t + 1], 2.0)
             for b in range(3) for t in range(5) if mask[b, t + 1] and y[b, t + 1] != -100]
    torch.testing.assert_close(L.kd_loss(shifted.student, shifted.teacher, 2.0, mask=keep),
                               torch.stack(loops).mean())
    torch.testing.assert_close(L.dkd_loss(*shifted[:3], mask=keep),
                               L.dkd_loss(*shifted[:3], mask=mask[:, 1:]))
    assert L.shift_for_causal_lm(a, None, y).teacher is None
    with pytest.raises(KdcollapseError, match="needs T >= 2"):
        L.shift_for_causal_lm(a[:, :1], c[:, :1], y[:, :1])
    with pytest.raises(KdcollapseError, match=r"target must have shape \(3, 6\)"):
        L.shift_for_causal_lm(a, c, y[:, 1:])
