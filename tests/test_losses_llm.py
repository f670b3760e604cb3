"""The LLM path: ignore_index, 0/1 masks, reductions, validation off (torch.compile), vocabulary
slicing, row chunking and the causal-LM shift, across every logit loss."""

import pytest
import torch
import torch.nn.functional as F

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError

K = 6
TABLE = torch.softmax(torch.randn(K, K, dtype=torch.float64), -1)

# Every logit loss as f(first, second, target, mask, **options).
LOSSES = {
    "kd": lambda a, b, y, m, **o: L.kd_loss(a, b, 2.0, mask=m, **o),
    "dkd": lambda a, b, y, m, **o: L.dkd_loss(a, b, y, mask=m, **o),
    "binary_kl": lambda a, b, y, m, **o: L.binary_kl_loss(a, b, mask=m, **o),
    "binary_kl_norm": lambda a, b, y, m, **o: L.binary_kl_norm_loss(a, b, mask=m, **o),
    "dkl": lambda a, b, y, m, **o: L.dkl_loss(a, b, mask=m, **o),
    "ikl": lambda a, b, y, m, **o: L.ikl_loss(a, b, target=y, temperature=2.0, mask=m, **o),
    "ikl_class_weights": lambda a, b, y, m, **o: L.ikl_loss(a, b, class_weights=TABLE, target=y,
                                                            mask=m, **o),
    "trades": lambda a, b, y, m, **o: L.trades_loss(a, b, y, mask=m, **o),
    "ikl_at": lambda a, b, y, m, **o: L.ikl_at_loss(a, b, y, TABLE, mask=m, **o),
    "forward_kl": lambda a, b, y, m, **o: L.forward_kl_loss(a, b, 2.0, mask=m, **o),
    "reverse_kl": lambda a, b, y, m, **o: L.reverse_kl_loss(a, b, 2.0, mask=m, **o),
    "jsd": lambda a, b, y, m, **o: L.jsd_loss(a, b, 0.3, mask=m, **o),
    "skew_forward_kl": lambda a, b, y, m, **o: L.skew_forward_kl_loss(a, b, 0.1, mask=m, **o),
    "skew_reverse_kl": lambda a, b, y, m, **o: L.skew_reverse_kl_loss(a, b, 0.2, 0.5, mask=m, **o),
    "tvd": lambda a, b, y, m, **o: L.tvd_loss(a, b, mask=m, **o),
}
LABELLED = ["dkd", "ikl", "ikl_class_weights", "trades", "ikl_at"]


def batch(b=3, steps=5, k=K, seed=0):
    """Sequence logits (both requiring grad), labels with -100, an int64 attention mask."""
    g = torch.Generator().manual_seed(seed)
    a, c = (3 * torch.randn(2, b, steps, k, generator=g, dtype=torch.float64)).unbind()
    y = torch.randint(0, k, (b, steps), generator=g)
    y[0, 1] = y[2, 4] = -100
    mask = torch.ones(b, steps, dtype=torch.long)
    mask[1, 3:] = 0
    return a.requires_grad_(), c.requires_grad_(), y, mask


def kept(y, mask, loss):
    keep = mask.bool()
    return keep & (y != -100) if loss in LABELLED else keep


def value_and_grads(fn, a, c):
    value = fn()
    scalar = value.sum() if value.dim() else value
    return (value, *torch.autograd.grad(scalar, (a, c), materialize_grads=True))


# --- ignore_index, integer masks, reductions --------------------------------------------------

@pytest.mark.parametrize("name", LOSSES)
def test_ignored_labels_and_int_masks_are_dropped_positions(name):
    loss_fn, (a, c, y, mask) = LOSSES[name], batch()
    keep = kept(y, mask, name)
    value = loss_fn(a, c, y, mask)  # -100 labels, also outside the mask, are no error
    torch.testing.assert_close(value, loss_fn(a[keep], c[keep], y[keep], None))
    torch.testing.assert_close(value, loss_fn(a, c, y, keep))
    g_a, g_c = torch.autograd.grad(value, (a, c), materialize_grads=True)
    assert g_a[~keep].eq(0).all() and g_c[~keep].eq(0).all()


@pytest.mark.parametrize("name", LABELLED)
def test_ignore_index_is_configurable_and_labels_are_checked_where_kept(name):
    loss_fn, (a, c, y, mask) = LOSSES[name], batch()
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
@pytest.mark.parametrize("name", LOSSES)
def test_reductions(name, validate):
    loss_fn, (a, c, y, mask) = LOSSES[name], batch()
    keep = kept(y, mask, name)
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

@pytest.mark.parametrize("name", LOSSES)
def test_unvalidated_path_gives_the_validated_values_and_gradients(name):
    loss_fn, (a, c, y, mask) = LOSSES[name], batch()
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
    """Dynamo traces each loss (forward and backward, aot_eager backend) in one graph with checks
    off; with them on it cannot (the read-back breaks the graph). Inductor is not used here: it
    compiles C++ for a minute per loss on the test machine."""
    a, c, y, mask = batch()
    a32, c32 = a.detach().float().requires_grad_(), c.detach().float()
    e_s, e_t = torch.randn(6, 4, requires_grad=True), torch.randn(6, 3)
    calls = {name: (fn, (a32, c32, y, mask)) for name, fn in LOSSES.items()}
    calls["rkd"] = (L.rkd_loss, (e_s, e_t))
    calls["contrastive"] = (L.intra_class_contrastive_loss,
                            (e_s, e_s.flip(0), e_s.unsqueeze(1).roll(1, 0)))
    torch._dynamo.reset()
    with L.validation(False):
        for name, (fn, args) in calls.items():
            value = torch.compile(fn, fullgraph=True, backend="aot_eager")(*args)
            torch.testing.assert_close(value, fn(*args), msg=name)
            value.backward()
    torch._dynamo.reset()
    with pytest.raises(Exception, match="(?i)unsupported|graph break|data-dependent"):
        torch.compile(L.kd_loss, fullgraph=True, backend="aot_eager")(a32, c32)


# --- vocabulary slicing ----------------------------------------------------------------------

@pytest.mark.parametrize("name", ["kd", "dkd", "binary_kl", "binary_kl_norm", "dkl", "ikl", "jsd", "tvd"])
def test_padded_vocabularies_need_an_explicit_vocab_size(name):
    loss_fn, (a, c, y, mask) = LOSSES[name], batch(k=8)
    y = y.clamp_max(K - 1)
    padded = torch.cat([c, torch.randn(3, 5, 4, dtype=torch.float64)], -1)  # teacher V = 12
    with pytest.raises(KdcollapseError, match=r"K = 8 classes, .* K = 12 \(padded vocabularies: "
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
@pytest.mark.parametrize("name", LOSSES)
def test_chunked_rows_equal_unchunked(name, validate):
    loss_fn, (a, c, y, mask) = LOSSES[name], batch(b=4, steps=5, k=50)
    y = y.clamp_max(K - 1) if "class_weights" in name or name == "ikl_at" else y
    if "class_weights" in name or name == "ikl_at":
        a, c = (x.detach()[..., :K].requires_grad_() for x in (a, c))
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
