"""Losses fused with the output head: equal to the unfused loss (logits = h Wᵀ, then the divergence and
the cross-entropy) in value and in the gradients of h and W, for every teacher form; stored top-k
teacher tokens with k = V give the full distribution bit for bit."""

import pytest
import torch
import torch.nn.functional as F

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError
from kdcollapse.losses.llm import token_divergence, token_divergences

N, H, V = 23, 8, 17


def inputs(dtype=torch.float64, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=dtype).requires_grad_()
    weight = (torch.randn(V, H, generator=g, dtype=dtype) / 2).requires_grad_()
    t_hidden = torch.randn(N, 6, generator=g, dtype=dtype)
    t_weight = torch.randn(V + 3, 6, generator=g, dtype=dtype)  # a padded teacher head
    labels = torch.randint(0, V, (N,), generator=g)
    labels[[2, 7]] = -100
    mask = torch.ones(N, dtype=torch.long)
    mask[-4:] = 0
    return hidden, weight, t_hidden, t_weight, labels, mask


def unfused(hidden, weight, teacher_logits, divergence, parameters, temperature, labels, mask, ce_weight):
    keep = mask.bool() & (labels != -100)
    logits = hidden @ weight.T
    loss = token_divergence(logits, teacher_logits[:, :V], divergence, temperature, mask=keep, **parameters)
    if ce_weight:
        loss = loss + ce_weight * F.cross_entropy(logits[keep], labels[keep])
    return loss


def grads(loss, hidden, weight):
    return (loss.detach(), *torch.autograd.grad(loss, (hidden, weight)))


def declared_cases():
    """Every declared token divergence without a target (those with one: the DKD tests below), each parameter
    at a value inside its range other than its default, temperatures and CE weights varied across them."""
    cases = []
    for i, (name, info) in enumerate(sorted(token_divergences(targets=False).items())):
        parameters = {key: p.low + 0.37 * (min(p.high, p.low + 1) - p.low) for key, p in info.divergence.parameters.items()}
        cases.append(pytest.param(name, parameters, (1.0, 2.0, 1.5)[i % 3], (0.0, 0.5, 1.0, 0.3)[i % 4], id=name))
    return cases


@pytest.mark.parametrize("divergence,beta,temperature,ce_weight", declared_cases())
@pytest.mark.parametrize("form", ["logits", "head"])
def test_fused_equals_unfused_in_value_and_gradients(divergence, beta, temperature, ce_weight, form):
    hidden, weight, t_hidden, t_weight, labels, mask = inputs()
    teacher_logits = t_hidden @ t_weight.T
    teacher = L.TeacherLogits(teacher_logits) if form == "logits" else L.TeacherHead(t_hidden, t_weight)
    expected = grads(unfused(hidden, weight, teacher_logits, divergence, beta, temperature, labels, mask,
                             ce_weight), hidden, weight)
    for chunk in (5, 64):  # chunks that do not divide N, and one chunk
        got = grads(L.fused_head_loss(hidden, weight, teacher, divergence, temperature, labels=labels,
                                      ce_weight=ce_weight, mask=mask, chunk_size=chunk, **beta), hidden, weight)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_the_loss_scales_its_gradients_by_the_incoming_one():
    hidden, weight, t_hidden, t_weight, labels, mask = inputs()
    teacher = L.TeacherHead(t_hidden, t_weight)
    once = grads(L.fused_head_loss(hidden, weight, teacher, mask=mask, chunk_size=4), hidden, weight)
    thrice = grads(3 * L.fused_head_loss(hidden, weight, teacher, mask=mask, chunk_size=4), hidden, weight)
    for a, b in zip(once[1:], thrice[1:]):
        torch.testing.assert_close(3 * a, b)


def test_stored_top_k_with_k_equal_to_v_is_the_full_distribution_bit_for_bit():
    hidden, weight, t_hidden, t_weight, labels, mask = inputs(torch.float32)
    logits = t_hidden @ t_weight[:V].T
    full = L.TopKTeacher.from_logits(logits, V)
    dense = full.log_probs(slice(None), V, 1.0)
    assert torch.equal(dense, F.log_softmax(logits, -1)) and torch.isneginf(full.log_rest).all()
    a = L.fused_head_loss(hidden, weight, L.TeacherLogits(logits), "jsd", beta=0.5, mask=mask, chunk_size=7)
    b = L.fused_head_loss(hidden, weight, full, "jsd", beta=0.5, mask=mask, chunk_size=7)
    assert torch.equal(a, b)


def test_stored_top_k_spreads_the_rest_evenly_and_keeps_the_top_k_exact():
    hidden, weight, t_hidden, t_weight, labels, mask = inputs()
    logits = (t_hidden @ t_weight[:V].T).double()
    k = 4
    stored = L.TopKTeacher.from_logits(logits, k)
    p = F.softmax(logits, -1)
    top = p.topk(k, -1)
    rest = 1 - top.values.sum(-1)
    torch.testing.assert_close(stored.log_rest.exp().double(), rest, rtol=1e-5, atol=1e-7)
    expanded = rest.unsqueeze(1).expand(N, V) / (V - k)  # the stated rule, written out
    expanded = expanded.scatter(1, top.indices, top.values)
    got = stored.log_probs(slice(None), V, 1.0).double().exp()
    torch.testing.assert_close(got, expanded, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(got.sum(-1), torch.ones(N, dtype=torch.float64))
    with pytest.raises(KdcollapseError, match="temperature 1.0; the loss asks for 2.0"):
        L.fused_head_loss(hidden, weight, stored, temperature=2.0)
    with pytest.raises(KdcollapseError, match=r"k must be an int in \[1, 17\]"):
        L.TopKTeacher.from_logits(logits, 0)


def test_bf16_fused_is_close_to_the_float32_unfused_loss_and_keeps_dtypes():
    hidden, weight, t_hidden, t_weight, labels, mask = inputs(torch.float32)
    teacher_logits = t_hidden @ t_weight.T
    expected = grads(unfused(hidden, weight, teacher_logits, "forward_kl", {}, 1.0, labels, mask, 1.0),
                     hidden, weight)
    h16, w16 = hidden.detach().bfloat16().requires_grad_(), weight.detach().bfloat16().requires_grad_()
    loss = L.fused_head_loss(h16, w16, L.TeacherLogits(teacher_logits.bfloat16()), labels=labels, ce_weight=1.0,
                             mask=mask, chunk_size=8)
    got = grads(loss, h16, w16)
    assert loss.dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.bfloat16
    for a, b in zip(got, expected):
        torch.testing.assert_close(a.float(), b, rtol=0.05, atol=0.02)


def test_bad_inputs_are_one_error_each():
    hidden, weight, t_hidden, t_weight, labels, mask = inputs()
    teacher = L.TeacherHead(t_hidden, t_weight)
    with pytest.raises(KdcollapseError, match="must share H and dtype"):
        L.fused_head_loss(hidden, weight[:, :4], teacher)
    with pytest.raises(KdcollapseError, match="ce_weight > 0 needs labels"):
        L.fused_head_loss(hidden, weight, teacher, ce_weight=1.0)
    with pytest.raises(KdcollapseError, match="no token is kept"):
        L.fused_head_loss(hidden, weight, teacher, mask=torch.zeros(N, dtype=torch.bool))
    with pytest.raises(KdcollapseError, match="chunk_size must be a positive int"):
        L.fused_head_loss(hidden, weight, teacher, chunk_size=0)
    with pytest.raises(KdcollapseError, match="teacher gives 23 tokens x 12 classes; the student has 23 tokens x 17"):
        L.fused_head_loss(hidden, weight, L.TeacherLogits(torch.randn(N, 12, dtype=torch.float64)))
    with pytest.raises(KdcollapseError, match="unknown divergence"):
        L.fused_head_loss(hidden, weight, teacher, "kl")


def dkd_unfused(hidden, weight, teacher_logits, beta, temperature, labels, mask, ce_weight):
    """The registered dkd_loss (α = 1) on the logits h Wᵀ, without its τ², plus the cross-entropy; the
    positions are dropped by dkd_loss's own (B, T) mask and ignore_index."""
    logits = hidden @ weight.T
    loss = L.dkd_loss(logits.unsqueeze(0), teacher_logits[:, :V].unsqueeze(0), labels.unsqueeze(0), alpha=1.0,
                      beta=beta, temperature=temperature, mask=mask.unsqueeze(0)) / temperature**2
    keep = mask.bool() & (labels != -100)
    return loss + ce_weight * F.cross_entropy(logits[keep], labels[keep]) if ce_weight else loss


def dkd_by_hand(logits, teacher_logits, labels, keep, beta, temperature):
    """DKD with α = 1 written out row by row: TCKD on [p_y, 1 − p_y], NCKD on the renormalised non-targets."""
    total = 0.0
    for z, t, y in zip(logits[keep], teacher_logits[keep], labels[keep]):
        q, p = F.softmax(z / temperature, -1), F.softmax(t / temperature, -1)
        others = torch.arange(len(q)) != y
        b_q, b_p = torch.stack([q[y], 1 - q[y]]), torch.stack([p[y], 1 - p[y]])
        q_hat, p_hat = q[others] / q[others].sum(), p[others] / p[others].sum()
        total = total + (b_p * (b_p / b_q).log()).sum() + beta * (p_hat * (p_hat / q_hat).log()).sum()
    return total / int(keep.sum())


@pytest.mark.parametrize("beta,temperature,ce_weight", [(8.0, 1.0, 0.0), (1.0, 2.0, 0.5), (0.0, 1.0, 1.0)])
@pytest.mark.parametrize("form", ["logits", "head", "top-k with k = V"])
def test_fused_dkd_equals_the_registered_dkd_loss_in_value_and_gradients(beta, temperature, ce_weight, form):
    hidden, weight, t_hidden, t_weight, labels, mask = inputs()
    teacher_logits = t_hidden @ t_weight.T
    teacher = {"logits": L.TeacherLogits(teacher_logits), "head": L.TeacherHead(t_hidden, t_weight),
               "top-k with k = V": L.TopKTeacher.from_logits(teacher_logits[:, :V], V, temperature)}[form]
    if form.startswith("top-k"):  # float32 storage: compare with the distribution it holds
        teacher_logits = teacher.log_probs(slice(None), V, temperature).double() * temperature
    expected = grads(dkd_unfused(hidden, weight, teacher_logits, beta, temperature, labels, mask, ce_weight),
                     hidden, weight)
    if not ce_weight:  # the registered loss is DKD as written out
        by_hand = dkd_by_hand((hidden @ weight.T).detach(), teacher_logits[:, :V], labels,
                              mask.bool() & (labels != -100), beta, temperature)
        torch.testing.assert_close(expected[0], by_hand, rtol=1e-10, atol=1e-12)
    for chunk in (5, 64):
        got = grads(L.fused_head_loss(hidden, weight, teacher, "dkd", temperature, beta=beta, labels=labels,
                                      ce_weight=ce_weight, mask=mask, chunk_size=chunk), hidden, weight)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_fused_dkd_on_stored_top_k_is_dkd_against_the_stored_distribution():
    """k < V: DKD against the teacher whose top k are exact and whose rest is spread evenly; a target outside
    the top k gets the even share as its teacher probability."""
    hidden, weight, t_hidden, t_weight, labels, mask = inputs()
    teacher_logits = (t_hidden @ t_weight[:V].T)
    stored = L.TopKTeacher.from_logits(teacher_logits, 4)
    as_stored = stored.log_probs(slice(None), V, 1.0).double()
    outside = ~(stored.indices.long() == labels.clamp_min(0).unsqueeze(1)).any(1)
    assert outside.any() and (~outside).any()  # both cases occur in these inputs
    expected = grads(dkd_unfused(hidden, weight, as_stored, 8.0, 1.0, labels, mask, 0.0), hidden, weight)
    got = grads(L.fused_head_loss(hidden, weight, stored, "dkd", beta=8.0, labels=labels, mask=mask, chunk_size=6),
                hidden, weight)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_fused_dkd_refuses_missing_labels_and_a_negative_beta():
    hidden, weight, t_hidden, t_weight, labels, mask = inputs()
    teacher = L.TeacherHead(t_hidden, t_weight)
    with pytest.raises(KdcollapseError, match="'dkd' needs labels"):
        L.fused_head_loss(hidden, weight, teacher, "dkd", beta=8.0)
    with pytest.raises(KdcollapseError, match="beta of dkd must be a number >= 0"):
        L.fused_head_loss(hidden, weight, teacher, "dkd", beta=-1.0, labels=labels)
    with pytest.raises(KdcollapseError, match=r"labels must be in \[0, 17\)"):
        L.fused_head_loss(hidden, weight, teacher, "dkd", beta=8.0, labels=labels.clamp_min(0) + 5)


@pytest.mark.parametrize("divergence,parameters", [("forward_kl", {}), ("reverse_kl", {}), ("jsd", {"beta": 0.3}),
                                                   ("jsd", {"beta": 0.0}), ("jsd", {"beta": 1.0})])
def test_a_declared_gradient_is_the_autograd_gradient_of_its_rows(divergence, parameters):
    """∂values/∂log_q of the declaration equals autograd through ``rows`` (log_q's entries free), its values
    equal ``rows``; and the loss fused with it equals the unfused loss at τ = 1 and 2, with and without CE, for
    the logits, head and stored top-k teachers (the top-k one as its log-probabilities)."""
    from kdcollapse.losses.llm import divergence_gradient, divergence_rows
    g = torch.Generator().manual_seed(3)
    log_q = F.log_softmax(torch.randn(7, 11, generator=g, dtype=torch.float64), -1).requires_grad_()
    log_p = F.log_softmax(torch.randn(7, 11, generator=g, dtype=torch.float64), -1)
    rows = divergence_rows(divergence, parameters)(log_q, log_p)
    values, grad = divergence_gradient(divergence, parameters)(log_q.detach().clone(), log_p)
    torch.testing.assert_close(values, rows.detach(), rtol=1e-13, atol=1e-15)
    (expected,) = torch.autograd.grad(rows.sum(), log_q)
    torch.testing.assert_close(grad, expected, rtol=1e-13, atol=1e-15)
    hidden, weight, t_hidden, t_weight, labels, mask = inputs()
    teachers = {"logits": L.TeacherLogits(t_hidden @ t_weight.T), "head": L.TeacherHead(t_hidden, t_weight)}
    for temperature in (1.0, 2.0):
        for ce_weight in (0.0, 0.5):
            expected = grads(unfused(hidden, weight, t_hidden @ t_weight.T, divergence, parameters, temperature,
                                     labels, mask, ce_weight), hidden, weight)
            for teacher in teachers.values():
                for chunk in (5, 64):
                    got = grads(L.fused_head_loss(hidden, weight, teacher, divergence, temperature, labels=labels,
                                                  ce_weight=ce_weight, mask=mask, chunk_size=chunk, **parameters),
                                hidden, weight)
                    for a, b in zip(got, expected):
                        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    # stored top-k tokens (float32 log-probabilities, not renormalised): the chunk's loss and logit gradient by
    # the declared gradient equal autograd's on the same chunk
    from kdcollapse.losses import fused as fused_module
    stored = L.TopKTeacher.from_logits(t_hidden @ t_weight[:V].T, 5)
    keep = mask.bool() & (labels != -100)
    z = (hidden @ weight.T).detach()
    span = slice(3, 15)
    for ce_weight in (0.0, 0.5):
        by_autograd = fused_module._autograd_gradient(
            hidden.detach()[span], weight.detach(), stored, span, V, 1.0, divergence_rows(divergence, parameters),
            keep[span], keep.sum(), labels, ce_weight, 1.0, False)
        declared = fused_module._declared_gradient(z[span], stored, span, V, 1.0, divergence_gradient(
            divergence, parameters), keep[span], keep.sum(), labels, ce_weight, 1.0)
        for a, b in zip(declared, by_autograd):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
