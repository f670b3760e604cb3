"""Stored top-k teacher tokens read by the rule ``tail="rest"`` (``kdcollapse.losses.TopKTeacher``): each
divergence compares the teacher and the student coarsened to k + 1 outcomes (the teacher's top k, then the
rest). Checked against the forward KL written out with probabilities, against the registered unfused divergences
on explicitly coarsened logits, against the data-processing inequality, and for what it leaves alone (the
student's distribution inside the rest)."""

import pytest
import torch
import torch.nn.functional as F

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError
from kdcollapse.losses.llm import token_divergence, token_divergences

N, H, V, K = 23, 8, 17, 4


def inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, H, generator=g, dtype=torch.float64).requires_grad_()
    weight = (torch.randn(V, H, generator=g, dtype=torch.float64) / 2).requires_grad_()
    teacher_logits = torch.randn(N, V, generator=g, dtype=torch.float64) * 2
    labels = torch.randint(0, V, (N,), generator=g)
    labels[[2, 7]] = -100
    mask = torch.ones(N, dtype=torch.long)
    mask[-4:] = 0
    return hidden, weight, teacher_logits, labels, mask


def grads(loss, hidden, weight):
    return (loss.detach(), *torch.autograd.grad(loss, (hidden, weight)))


def rest_teacher(teacher_logits, k=K, temperature=1.0):
    return L.TopKTeacher.from_logits(teacher_logits, k, temperature, tail="rest")


def fkl_by_hand(hidden, weight, teacher_logits, keep, k=K):
    """Σ_top p (log p − log q) + r (log r − log(1 − Σ_top q)), row by row with probabilities."""
    total = 0.0
    for z, t in zip((hidden @ weight.T)[keep], teacher_logits[keep]):
        p, q = F.softmax(t, -1), F.softmax(z, -1)
        top = p.topk(k).indices
        r_p, r_q = 1 - p[top].sum(), 1 - q[top].sum()
        total = total + (p[top] * (p[top] / q[top]).log()).sum() + r_p * (r_p / r_q).log()
    return total / int(keep.sum())


def coarse_logits(logits, teacher_logits, k=K, temperature=1.0):
    """Logits whose softmax at τ is the coarsened distribution: the top k as they are, the rest as
    τ · logsumexp(z_rest / τ); the teacher's as τ times its coarsened log-probabilities at τ (top k, then log rest)."""
    top = F.log_softmax(teacher_logits / temperature, -1).topk(k)
    rest = torch.ones_like(logits, dtype=torch.bool).scatter(1, top.indices, False)
    z_rest = temperature * (logits / temperature).masked_fill(~rest, float("-inf")).logsumexp(-1, keepdim=True)
    log_p = F.log_softmax(teacher_logits.float() / temperature, -1).double()
    p_rest = log_p.masked_fill(~rest, float("-inf")).logsumexp(-1, keepdim=True)
    return (torch.cat([logits.gather(1, top.indices), z_rest], 1),
            temperature * torch.cat([log_p.gather(1, top.indices), p_rest], 1), top.indices)


def test_rest_forward_kl_is_the_coarsened_kl_written_out():
    hidden, weight, teacher_logits, labels, mask = inputs()
    keep = mask.bool() & (labels != -100)
    expected = grads(fkl_by_hand(hidden, weight, teacher_logits, keep), hidden, weight)
    for chunk in (5, 64):
        got = grads(L.fused_head_loss(hidden, weight, rest_teacher(teacher_logits), labels=labels, mask=mask,
                                      chunk_size=chunk), hidden, weight)
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)  # the store holds float32 log-probabilities


def declared():
    """Every declared divergence without a target at its declared parameters (the store's float32 rounding, raised
    to ABKD's far exponents, would swamp a float64 comparison), temperatures and CE weights varied."""
    return [pytest.param(name, {}, (1.0, 2.0)[i % 2], (0.0, 0.5)[i % 2], id=name)
            for i, name in enumerate(sorted(token_divergences(targets=False)))]


@pytest.mark.parametrize("divergence,parameters,temperature,ce_weight", declared())
def test_every_divergence_under_rest_is_that_divergence_on_the_coarsened_distributions(divergence, parameters,
                                                                                        temperature, ce_weight):
    hidden, weight, teacher_logits, labels, mask = inputs(1)
    keep = mask.bool() & (labels != -100)
    logits = hidden @ weight.T
    student, teacher, _ = coarse_logits(logits, teacher_logits, temperature=temperature)
    expected = token_divergence(student, teacher, divergence, temperature, mask=keep, **parameters)
    if ce_weight:  # the cross-entropy is over the V tokens, as with any teacher
        expected = expected + ce_weight * F.cross_entropy(logits[keep], labels[keep])
    stored = rest_teacher(teacher_logits, temperature=temperature)
    got = L.fused_head_loss(hidden, weight, stored, divergence, temperature, labels=labels, ce_weight=ce_weight,
                            mask=mask, chunk_size=6, **parameters)
    for a, b in zip(grads(got, hidden, weight), grads(expected, hidden, weight)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_rest_dkd_takes_the_target_outcome_among_the_k_plus_one():
    """DKD under rest: a target in the teacher's top k is that outcome, one outside is the rest."""
    from tests.test_losses_fused import dkd_by_hand

    hidden, weight, teacher_logits, labels, mask = inputs(2)
    keep = mask.bool() & (labels != -100)
    student, teacher, top = coarse_logits(hidden @ weight.T, teacher_logits)
    hit = top == labels.clamp_min(0).unsqueeze(1)
    assert hit.any(1)[keep].any() and (~hit.any(1))[keep].any()  # both cases occur
    target = torch.where(hit.any(1), hit.double().argmax(1), K)
    expected = dkd_by_hand(student, teacher, target, keep, 8.0, 1.0)
    got = L.fused_head_loss(hidden, weight, rest_teacher(teacher_logits), "dkd", beta=8.0, labels=labels, mask=mask,
                            chunk_size=7)
    for a, b in zip(grads(got, hidden, weight), grads(expected, hidden, weight)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)


def test_rest_forward_kl_is_at_most_the_full_kl_and_equals_it_at_k_equal_to_v():
    """The data-processing inequality row by row (coarsening cannot increase a KL), with equality at k = V, where
    the rule changes nothing (bit for bit the full teacher)."""
    hidden, weight, teacher_logits, labels, mask = inputs(3)
    ones = torch.ones(N, dtype=torch.long)
    full = L.TeacherLogits(teacher_logits.float().log_softmax(-1).double())  # the store's float32 rounding
    for row in range(N):
        one = torch.zeros(N, dtype=torch.long)
        one[row] = 1
        coarse = L.fused_head_loss(hidden, weight, rest_teacher(teacher_logits), mask=one)
        assert float(coarse.detach()) <= float(L.fused_head_loss(hidden, weight, full, mask=one).detach()) + 1e-12
    everything = L.TopKTeacher.from_logits(teacher_logits, V, tail="rest")
    assert torch.equal(L.fused_head_loss(hidden, weight, everything, "jsd", beta=0.3, mask=ones),
                       L.fused_head_loss(hidden, weight, L.TopKTeacher.from_logits(teacher_logits, V), "jsd", beta=0.3,
                                         mask=ones))


def test_rest_leaves_the_students_distribution_inside_the_rest_as_it_is():
    """∂loss/∂z_j over the tokens outside the teacher's top k is proportional to q_j (one scale for the whole
    rest), so a step moves the rest's mass, never its shape; the uniform rule pulls it towards flat."""
    _, _, teacher_logits, _, _ = inputs(4)
    g = torch.Generator().manual_seed(5)
    z = torch.randn(N, V, generator=g, dtype=torch.float64).requires_grad_()
    eye = torch.eye(V, dtype=torch.float64).requires_grad_()
    for tail, proportional in (("rest", True), ("uniform", False)):
        teacher = L.TopKTeacher.from_logits(teacher_logits, K, tail=tail)
        (grad,) = torch.autograd.grad(L.fused_head_loss(z, eye, teacher), z)
        rest = torch.ones(N, V, dtype=torch.bool).scatter(1, teacher.indices.long(), False)
        ratio = (grad / F.softmax(z.detach(), -1))[rest].view(N, V - K)
        spread = (ratio.max(1).values - ratio.min(1).values).abs().max()
        assert (float(spread) < 1e-12) == proportional


def test_rest_refuses_a_full_distribution_and_a_bad_rule():
    _, _, teacher_logits, _, _ = inputs()
    with pytest.raises(KdcollapseError, match="tail='rest' give no distribution over the 17 tokens"):
        rest_teacher(teacher_logits).log_probs(slice(None), V, 1.0)
    with pytest.raises(KdcollapseError, match="tail must be one of uniform, rest, got 'flat'"):
        L.TopKTeacher.from_logits(teacher_logits, K, tail="flat")
    with pytest.raises(KdcollapseError, match="temperature 1.0; the loss asks for 2.0"):
        hidden, weight, *_ = inputs()
        L.fused_head_loss(hidden, weight, rest_teacher(teacher_logits), temperature=2.0)


def test_an_f_divergence_with_a_declared_gradient_takes_it_under_rest(monkeypatch):
    """Forward KL, reverse KL and JSD are declared f-divergences: under rest they are computed against the
    teacher whose rest follows the student's shape, with their declared gradient (the comparisons above then check
    that route against the coarsened rows); TVD has no declared gradient and goes through autograd."""
    import kdcollapse.losses.fused as fused

    calls = []
    through_autograd = fused._autograd_gradient
    monkeypatch.setattr(fused, "_autograd_gradient", lambda *a: (calls.append(1), through_autograd(*a))[1])
    hidden, weight, teacher_logits, labels, mask = inputs()
    for divergence, declared in (("forward_kl", True), ("reverse_kl", True), ("jsd", True), ("tvd", False)):
        calls.clear()
        L.fused_head_loss(hidden, weight, rest_teacher(teacher_logits), divergence, mask=mask)
        assert (not calls) == declared, divergence
