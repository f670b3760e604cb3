"""ABKD's α-β divergence (Wang et al., ICML 2025) against the official ``ab_div`` on identical inputs, a
float64 reference written from the definition, the paper's limits (forward and reverse KL, α-divergence,
Hellinger), and the fused-head and stored top-k paths.

The official function computes in float32; the transcription takes the dtype as a parameter and runs in
float64 here, which is the only change."""

import pytest
import torch
import torch.nn.functional as F

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError
from kdcollapse.losses.abkd import abkd_rows
from token_cases import FORMS, assert_fused_equals, head_case, kept_probabilities, token_logits

V = 11  # logits (3, 4, V): tests/token_cases.py


def logits(seed=0, scale=2.0):
    return token_logits(V, seed, scale)


# ghwang-s/abkd @ df813185e69d21d1e99510272cd94e49be7250c0, distillation_llm/distillm/losses.py, ab_div
# (float32 there, ``dtype`` here).
def official_ab_div(logits, teacher_logits, no_model_batch, alpha, beta, dtype=torch.float32):
    teacher_probs = F.softmax(teacher_logits, dim=-1, dtype=dtype)
    student_probs = F.softmax(logits, dim=-1, dtype=dtype)
    inf_mask = torch.isinf(logits) | torch.isinf(teacher_logits)
    if alpha == 0 and beta == 0:
        log_diff = torch.log(student_probs) - torch.log(teacher_probs)
        log_diff = torch.masked_fill(log_diff, inf_mask, 0)
        divergence = 0.5 * torch.sum(log_diff ** 2, dim=-1)
    elif alpha == 0 and beta != 0:
        q_beta = torch.pow(student_probs, beta)
        p_beta = torch.pow(teacher_probs, beta)
        likeli_ratio = q_beta / p_beta
        likeli_ratio = torch.masked_fill(likeli_ratio, torch.isnan(likeli_ratio), 0)
        divergence = (1 / beta) * torch.sum(q_beta * torch.log(likeli_ratio) - q_beta + p_beta, dim=-1)
    elif beta == 0 and alpha != 0:
        p_alpha = torch.pow(teacher_probs, alpha)
        p_alpha = torch.masked_fill(p_alpha, inf_mask, 0)
        q_alpha = torch.pow(student_probs, alpha)
        q_alpha = torch.masked_fill(q_alpha, inf_mask, 0)
        likeli_ratio = p_alpha / q_alpha
        likeli_ratio = torch.masked_fill(likeli_ratio, torch.isnan(likeli_ratio), 0)
        divergence = (1 / alpha) * torch.sum(p_alpha * torch.log(likeli_ratio) - p_alpha + q_alpha, dim=-1)
    elif alpha + beta == 0:
        p_alpha = torch.pow(teacher_probs, alpha)
        q_alpha = torch.pow(student_probs, alpha)
        p_alpha = torch.masked_fill(p_alpha, inf_mask, 0)
        q_alpha = torch.masked_fill(q_alpha, inf_mask, 0)
        divergence = torch.sum((1 / alpha) * (torch.log(q_alpha / p_alpha) + (p_alpha / q_alpha) - 1), dim=-1)
    else:
        p_alpha = torch.pow(teacher_probs, alpha)
        q_beta = torch.pow(student_probs, beta)
        divergence = p_alpha
        divergence.mul_(q_beta)
        divergence.masked_fill_(inf_mask, 0)
        tmp = torch.pow(teacher_probs, alpha + beta)
        tmp.mul_(alpha / (alpha + beta))
        tmp.masked_fill_(inf_mask, 0)
        divergence.sub_(tmp)
        del tmp
        tmp = torch.pow(student_probs, alpha + beta)
        tmp.mul_(beta / (alpha + beta))
        tmp.masked_fill_(inf_mask, 0)
        divergence.sub_(tmp)
        del tmp
        divergence = -torch.sum(divergence, dim=-1) / (alpha * beta)
    mask = (no_model_batch["label"] != -100).int()
    masked_divergence = divergence * mask.float()
    x = torch.sum(masked_divergence, dim=-1)
    ab_loss = torch.sum(x) / torch.sum(mask.float())
    return ab_loss


PARAMETERS = [(0.2, 0.7), (0.5, 0.5), (1.0, 0.0), (0.0, 1.0), (0.0, 0.0), (0.3, 0.0), (0.0, 0.4), (0.6, -0.6),
              (-0.5, 0.5), (1.5, -0.3), (2.0, 1.0)]


def official_factor(alpha, beta):
    """The official special cases α = 0, β = 0, α + β = 0 divide by β (α) where the limit of the general
    formula divides by β² (α²): they are the limit times this factor (1 in the general case)."""
    if alpha == 0 and beta == 0:
        return 1.0
    return beta if alpha == 0 else alpha if beta == 0 or alpha + beta == 0 else 1.0


@pytest.mark.parametrize("alpha,beta", PARAMETERS)
def test_abkd_equals_the_official_ab_div_in_value_and_gradients(alpha, beta):
    s, t, labels = logits(seed=1)
    official = official_ab_div(s, t, {"label": labels}, alpha, beta, torch.float64)
    value = official_factor(alpha, beta) * L.abkd_loss(s, t, alpha, beta, mask=labels != -100)
    torch.testing.assert_close(value, official, rtol=1e-11, atol=1e-13)
    # the official general case's in-place ops break autograd in the teacher, so the student gradient only
    (ours,), (theirs,) = torch.autograd.grad(value, (s,)), torch.autograd.grad(official, (s,))
    torch.testing.assert_close(ours, theirs, rtol=1e-9, atol=1e-12)


def reference(s, t, alpha, beta, temperature, keep):
    """Token by token on explicit probabilities: the general formula, or its limit as Cichocki, Cruces &
    Amari (2011) state it."""
    values = []
    for q, p in kept_probabilities(s, t, temperature, keep):  # one kept token at a time
        if alpha == 0 and beta == 0:
            d = 0.5 * sum((torch.log(q[v]) - torch.log(p[v])) ** 2 for v in range(V))
        elif alpha == 0:
            d = sum(q[v] ** beta * torch.log(q[v] ** beta / p[v] ** beta) - q[v] ** beta + p[v] ** beta
                    for v in range(V)) / beta ** 2
        elif beta == 0:
            d = sum(p[v] ** alpha * torch.log(p[v] ** alpha / q[v] ** alpha) - p[v] ** alpha + q[v] ** alpha
                    for v in range(V)) / alpha ** 2
        elif alpha + beta == 0:
            d = sum(torch.log(q[v] ** alpha / p[v] ** alpha) + p[v] ** alpha / q[v] ** alpha - 1
                    for v in range(V)) / alpha ** 2
        else:
            a, c = alpha, beta
            d = -sum(p[v] ** a * q[v] ** c - a / (a + c) * p[v] ** (a + c) - c / (a + c) * q[v] ** (a + c)
                     for v in range(V)) / (a * c)
        values.append(d)
    return sum(values) / len(values)


@pytest.mark.parametrize("alpha,beta,temperature", [(0.2, 0.7, 1.0), (0.0, 0.0, 2.0), (0.4, -0.4, 1.5),
                                                    (0.0, 0.3, 2.0), (0.7, 0.0, 0.8), (1.2, 0.5, 2.0)])
def test_abkd_equals_the_float64_reference(alpha, beta, temperature):
    s, t, labels = logits(seed=2)
    keep = labels != -100
    value = L.abkd_loss(s, t, alpha, beta, temperature, mask=keep)
    expected = reference(s, t, alpha, beta, temperature, keep)
    torch.testing.assert_close(value, expected, rtol=1e-11, atol=1e-13)
    for got, want in zip(torch.autograd.grad(value, (s, t)), torch.autograd.grad(expected, (s, t))):
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-12)


def test_the_papers_limits_and_identities():
    s, t, _ = logits(seed=3)
    log_q, log_p = F.log_softmax(s, -1), F.log_softmax(t, -1)
    p, q = log_p.exp(), log_q.exp()
    forward = (p * (log_p - log_q)).sum(-1)
    reverse = (q * (log_q - log_p)).sum(-1)
    torch.testing.assert_close(abkd_rows(log_q, log_p, 1.0, 0.0), forward)  # (1, 0): KL(p ‖ q)
    torch.testing.assert_close(abkd_rows(log_q, log_p, 0.0, 1.0), reverse)  # (0, 1): KL(q ‖ p)
    torch.testing.assert_close(L.abkd_loss(s, t, 1.0, 0.0), L.forward_kl_loss(s, t))
    torch.testing.assert_close(L.abkd_loss(s, t, 0.0, 1.0), L.reverse_kl_loss(s, t))
    # β = 1 − α: Amari's α-divergence 1/(α(1−α)) Σ [α p + (1−α) q − p^α q^(1−α)]
    a = 0.3
    amari = (a * p + (1 - a) * q - p ** a * q ** (1 - a)).sum(-1) / (a * (1 - a))
    torch.testing.assert_close(abkd_rows(log_q, log_p, a, 1 - a), amari)
    # (½, ½): 2 Σ (√p − √q)²
    torch.testing.assert_close(abkd_rows(log_q, log_p, 0.5, 0.5), 2 * ((p.sqrt() - q.sqrt()) ** 2).sum(-1))
    # the special cases are the limits of the general formula
    for (alpha, beta), near in [((0.0, 0.0), (1e-5, 2e-5)), ((0.0, 0.4), (1e-7, 0.4)), ((0.3, 0.0), (0.3, 1e-7)),
                                ((0.5, -0.5), (0.5, -0.5 + 1e-7))]:
        torch.testing.assert_close(abkd_rows(log_q, log_p, *near), abkd_rows(log_q, log_p, alpha, beta),
                                   rtol=1e-3, atol=1e-6)
    # zero at q = p, positive elsewhere
    for alpha, beta in PARAMETERS:
        assert abkd_rows(log_p, log_p, alpha, beta).abs().max() < 1e-12
        assert (abkd_rows(log_q, log_p, alpha, beta) > 0).all()


def test_parameters_are_checked():
    s, t, _ = logits()
    hidden, teacher = torch.eye(3, dtype=torch.float64), L.TeacherLogits(torch.randn(3, 3, dtype=torch.float64))
    named = L.fused_head_loss(hidden, hidden, teacher, "abkd", alpha=0.2, beta=0.7)
    assert torch.equal(L.fused_head_loss(hidden, hidden, teacher, "abkd"), named)  # the defaults
    with pytest.raises(KdcollapseError, match="divergence 'abkd' takes alpha, beta, not 'gamma'"):
        L.fused_head_loss(hidden, hidden, teacher, "abkd", gamma=1.0)
    for bad in (float("nan"), float("inf"), "0.5", True):
        with pytest.raises(KdcollapseError, match="beta of abkd must be a number"):
            L.abkd_loss(s, t, 0.5, bad)


@pytest.mark.parametrize("form", FORMS)
def test_fused_abkd_equals_the_unfused_loss(form):
    case, temperature = head_case(19, [1, 8]), 2.0
    teacher, keep, z, labels = case.teacher(form, temperature), case.keep, case.student_logits, case.labels
    if form.startswith("top-k"):  # the stored float32 log-probabilities as they are
        stored = teacher.log_probs(slice(None), case.vocab, temperature).double()
        distill = abkd_rows(F.log_softmax(z / temperature, -1), stored, 0.2, 0.7)[keep].mean()
    else:
        distill = L.abkd_loss(z, case.teacher_logits, 0.2, 0.7, temperature, mask=keep)
    expected = distill + 0.5 * F.cross_entropy(z[keep], labels[keep])
    assert_fused_equals(lambda chunk: L.fused_head_loss(case.hidden, case.weight, teacher, "abkd", temperature,
                                                        labels=labels, ce_weight=0.5, chunk_size=chunk, alpha=0.2,
                                                        beta=0.7), expected, case)
