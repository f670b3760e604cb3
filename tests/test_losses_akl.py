"""AKL (Wu et al., COLING 2025) against the authors' code on identical inputs, a slow reference written
from the paper's definitions (head = the most probable tokens up to cumulative mass μ), its identities,
and the fused-head and stored top-k paths.

The official functions compute in float32; the transcription takes the dtype as a parameter and runs in
float64 here, which is the only change."""

import pytest
import torch
import torch.nn.functional as F

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError
from kdcollapse.losses.akl import akl_rows, akl_weights
from kdcollapse.losses.llm import token_divergence
from token_cases import FORMS, assert_fused_equals, head_case, kept_probabilities, token_logits

V = 13  # logits (3, 4, V): tests/token_cases.py


def logits(seed=0, scale=2.0):
    return token_logits(V, seed, scale)


# --- the authors' code, transcribed ------------------------------------------------------------------
# wutaiqiang/LLM_KD_AKL @ 91853fbc69a30f7c2ef1d4df94179652034978b5, AKL.py: get_ratio, get_kl, AKL. That
# file's AKL reads an undefined global ``no_model_batch`` and returns nothing; the same three functions with
# ``no_model_batch`` as an argument and the return are in ghwang-s/abkd @
# df813185e69d21d1e99510272cd94e49be7250c0, distillation_llm/distillm/losses.py (get_ratio and get_kl there
# are identical to the authors'), which is what is transcribed.

def official_get_ratio(teacher_logits, logits, mu=0.5, dtype=torch.float32):
    teacher_logits = torch.masked_fill(teacher_logits, torch.isinf(teacher_logits), 0).to(dtype)
    logits = torch.masked_fill(logits, torch.isinf(logits), 0).to(dtype)
    teacher_probs = F.softmax(teacher_logits, dim=-1, dtype=dtype)
    student_probs = F.softmax(logits, dim=-1, dtype=dtype).detach()
    re_teacher_probs, idx = teacher_probs.sort(dim=-1, descending=True)
    re_student_probs = student_probs.gather(dim=-1, index=idx)
    errors = torch.abs(re_teacher_probs - re_student_probs)
    cum_sum = torch.cumsum(re_teacher_probs, dim=-1)
    mask = cum_sum > mu
    mask[:, :, 0] = False
    s1 = torch.masked_fill(errors, mask, 0.0).sum(dim=-1)
    s2 = torch.masked_fill(errors, ~mask, 0.0).sum(dim=-1)
    return s1 / (s1 + s2), s2 / (s1 + s2)


def official_get_kl(teacher_logits, logits, inf_mask, mask, ratio=None, dtype=torch.float32):
    teacher_probs = F.softmax(teacher_logits, dim=-1, dtype=dtype)
    teacher_logprobs = F.log_softmax(teacher_logits, dim=-1, dtype=dtype)
    teacher_prod_probs = torch.masked_fill(teacher_probs * teacher_logprobs, inf_mask, 0)
    teacher_x = torch.sum(teacher_prod_probs, dim=-1).view(-1)
    logprobs = F.log_softmax(logits, dim=-1, dtype=dtype)
    prod_probs = torch.masked_fill(teacher_probs * logprobs, inf_mask, 0)
    x = torch.sum(prod_probs, dim=-1).view(-1)
    if ratio is None:
        distil_loss = torch.sum((teacher_x - x) * mask.view(-1), dim=0) / torch.sum(mask.view(-1), dim=0)
    else:
        distil_loss = torch.sum((teacher_x - x) * ratio.view(-1) * mask.view(-1), dim=0) / torch.sum(
            mask.view(-1), dim=0)
    return distil_loss


def official_akl(teacher_logits, logits, no_model_batch, mu=0.5, dtype=torch.float32):
    inf_mask = torch.isinf(logits)
    mask = (no_model_batch["label"] != -100).int()
    h_ratio, l_ratio = official_get_ratio(teacher_logits, logits, mu, dtype)
    distil_loss = official_get_kl(teacher_logits, logits, inf_mask, mask, h_ratio, dtype) + official_get_kl(
        logits, teacher_logits, inf_mask, mask, l_ratio, dtype)
    return distil_loss


@pytest.mark.parametrize("mu", [0.5, 0.1, 0.9])
@pytest.mark.parametrize("seed", [0, 1])
def test_akl_equals_the_authors_code_in_value_and_gradients(mu, seed):
    s, t, labels = logits(seed)
    official = official_akl(t, s, {"label": labels}, mu, torch.float64)
    value = L.akl_loss(s, t, mu, mask=labels != -100)
    torch.testing.assert_close(value, official, rtol=1e-12, atol=1e-14)
    for ours, theirs in zip(torch.autograd.grad(value, (s, t)), torch.autograd.grad(official, (s, t))):
        torch.testing.assert_close(ours, theirs, rtol=1e-10, atol=1e-13)
    head, tail = official_get_ratio(t, s, mu, torch.float64)
    ours_head, ours_tail = akl_weights(F.log_softmax(s, -1), F.log_softmax(t, -1), mu)
    torch.testing.assert_close(ours_head, head, rtol=1e-12, atol=1e-14)
    torch.testing.assert_close(ours_tail, tail, rtol=1e-12, atol=1e-14)


# --- a slow reference from the paper's definitions ----------------------------------------------------

def reference(s, t, mu, temperature, keep):
    """One token at a time: head = the most probable teacher tokens while their running sum stays <= μ (and
    the first), the gaps, the weights as numbers (no gradient through them), then the two KLs."""
    values = []
    for q, p in kept_probabilities(s, t, temperature, keep):  # one kept token at a time
        order = sorted(range(V), key=lambda v: -p[v].item())
        head, running = set(), 0.0
        for rank, v in enumerate(order):
            running += p[v].item()
            if rank == 0 or running <= mu:
                head.add(v)
        g_head = sum(abs((p[v] - q[v]).item()) for v in head)
        g_tail = sum(abs((p[v] - q[v]).item()) for v in range(V) if v not in head)
        forward = sum(p[v] * torch.log(p[v] / q[v]) for v in range(V))
        reverse = sum(q[v] * torch.log(q[v] / p[v]) for v in range(V))
        values.append(g_head / (g_head + g_tail) * forward + g_tail / (g_head + g_tail) * reverse)
    return sum(values) / len(values)


@pytest.mark.parametrize("mu,temperature", [(0.5, 1.0), (0.3, 2.0), (0.8, 0.7)])
def test_akl_equals_the_slow_reference_of_its_definition(mu, temperature):
    s, t, labels = logits(seed=3)
    keep = labels != -100
    value = L.akl_loss(s, t, mu, temperature, mask=keep)
    expected = reference(s, t, mu, temperature, keep)
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-14)
    (got,), (want,) = torch.autograd.grad(value, (s,)), torch.autograd.grad(expected, (s,))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


def test_akl_identities():
    s, t, _ = logits(seed=4)
    log_q, log_p = F.log_softmax(s, -1), F.log_softmax(t, -1)
    forward = (log_p.exp() * (log_p - log_q)).sum(-1)
    reverse = (log_q.exp() * (log_q - log_p)).sum(-1)
    head, tail = akl_weights(log_q, log_p, 0.5)
    torch.testing.assert_close(head + tail, torch.ones_like(head))
    assert ((head > 0) & (tail > 0)).all()  # both parts have a gap on these inputs
    # μ = 1: every token is in the head (in the rows whose cumulative sum does not round above 1), so AKL is
    # the forward KL there; everywhere the value lies between the two KLs
    whole = log_p.exp().sort(-1, descending=True).values.cumsum(-1)[..., -1] <= 1
    assert whole.sum() >= 3
    torch.testing.assert_close(akl_rows(log_q, log_p, 1.0)[whole], forward[whole], rtol=1e-12, atol=1e-14)
    value = akl_rows(log_q, log_p, 0.5)
    assert ((value >= torch.minimum(forward, reverse) - 1e-12) & (value <= torch.maximum(forward, reverse) + 1e-12)).all()
    # μ = 0: the head is the most probable token alone; its gap is |p_max − q_at_that_token|
    head0, _ = akl_weights(log_q, log_p, 0.0)
    top = log_p.argmax(-1, keepdim=True)
    gap_top = (log_p.exp().gather(-1, top) - log_q.exp().gather(-1, top)).abs().squeeze(-1)
    total = (log_p.exp() - log_q.exp()).abs().sum(-1)
    torch.testing.assert_close(head0, gap_top / total)
    # zero at q = p (the weights are ½, ½ there), positive elsewhere, finite gradients
    assert L.akl_loss(t, t).abs() < 1e-15 and L.akl_loss(s, t) > 1e-3
    torch.testing.assert_close(akl_weights(log_p, log_p)[0], torch.full_like(head, 0.5))
    grad = torch.autograd.grad(L.akl_loss(t.detach().clone().requires_grad_(), t), t)[0]
    assert torch.isfinite(grad).all()


def test_swapping_head_and_tail_weights_changes_the_loss():
    """The two weights differ on these inputs, so a loss with head and tail swapped is not AKL."""
    s, t, _ = logits(seed=5)
    log_q, log_p = F.log_softmax(s, -1), F.log_softmax(t, -1)
    head, tail = akl_weights(log_q, log_p)
    forward = (log_p.exp() * (log_p - log_q)).sum(-1)
    reverse = (log_q.exp() * (log_q - log_p)).sum(-1)
    swapped = (tail * forward + head * reverse).mean()
    assert (akl_rows(log_q, log_p).mean() - swapped).abs() > 1e-3


def test_bad_mu_is_one_error():
    s, t, _ = logits()
    for bad in (-0.1, 1.5, "0.5", True):
        with pytest.raises(KdcollapseError, match=r"mu of akl must be a number in \[0, 1\]"):
            L.akl_loss(s, t, bad)


@pytest.mark.parametrize("form", FORMS)
def test_fused_akl_equals_the_unfused_loss(form):
    case = head_case(19, [1, 8])
    teacher = case.teacher(form, 2.0)
    temperature = 2.0 if form.startswith("top-k") else 1.5
    keep, z, labels = case.keep, case.student_logits, case.labels
    if form.startswith("top-k"):  # the stored float32 log-probabilities as they are (they sum to 1 ± 1e-7)
        stored = teacher.log_probs(slice(None), case.vocab, temperature).double()
        distill = akl_rows(F.log_softmax(z / temperature, -1), stored, 0.4)[keep].mean()
    else:
        distill = L.akl_loss(z, case.teacher_logits, 0.4, temperature, mask=keep)
    expected = distill + 0.5 * F.cross_entropy(z[keep], labels[keep])
    assert_fused_equals(lambda chunk: L.fused_head_loss(case.hidden, case.weight, teacher, "akl", temperature,
                                                        labels=labels, ce_weight=0.5, chunk_size=chunk, mu=0.4),
                        expected, case)


def test_akl_on_stored_top_k_ties_are_ordered_by_token():
    """Stored top-k tokens spread the rest evenly, so p ties at the head boundary when the top k hold less
    than μ; the stable sort puts the lower token index first, the same on every call."""
    g = torch.Generator().manual_seed(7)
    z = torch.randn(5, 40, generator=g, dtype=torch.float64)
    stored = L.TopKTeacher.from_logits(z.float(), 2)
    log_p = stored.log_probs(slice(None), 40, 1.0).double()
    log_q = F.log_softmax(torch.randn(5, 40, generator=g, dtype=torch.float64), -1)
    assert (log_p.exp().topk(2).values.sum(-1) < 0.5).any()  # the boundary falls among the tied tokens
    first = akl_rows(log_q, log_p, 0.5)
    assert torch.equal(first, akl_rows(log_q.clone(), log_p.clone(), 0.5))
    assert torch.isfinite(first).all() and (first > 0).all()
    torch.testing.assert_close(token_divergence(torch.log_softmax(log_q, -1), log_p, "akl"), first.mean())
