"""The LLM token divergences against an independent float64 reference, the papers' identities, and the
official code on identical inputs (literal transcriptions below, with the repository, path and commit).

The official functions compute in float32 (``dtype=torch.float32``); the transcriptions take that dtype
as a parameter and run in float64 here, which is the only change."""

import math

import pytest
import torch
import torch.nn.functional as F

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError
from kdcollapse.losses.llm import token_divergence, token_divergences
from token_cases import kept_probabilities, token_logits

V = 11  # logits (3, 4, V): tests/token_cases.py
WEIGHTED = {"jsd": (L.jsd_loss, "beta"), "skew_forward_kl": (L.skew_forward_kl_loss, "alpha"),
            "skew_reverse_kl": (L.skew_reverse_kl_loss, "alpha")}


def logits(seed=0, scale=3.0):
    return token_logits(V, seed, scale)


def named(name, weight):
    """The one declared parameter of ``name`` (beta, alpha) set to ``weight`` (None: none given)."""
    if isinstance(weight, dict):  # several parameters (abkd's alpha and beta) by name
        return weight
    parameters = list(token_divergences()[name].divergence.parameters)
    if len(parameters) > 1:  # one number cannot name them: their defaults
        return {}
    return {} if weight is None or not parameters else {parameters[0]: weight}


def ours(name, s, t, weight, temperature, mask):
    return token_divergence(s, t, name, temperature, mask=mask, **named(name, weight))


# --- an independent reference: one token at a time, probabilities written out ------------------------

def reference(name, s, t, weight, temperature, keep):
    """Mean over kept tokens, each divergence from its textbook formula on explicit probabilities."""
    values = []
    for q, p in kept_probabilities(s, t, temperature, keep):  # one kept token at a time
        def kl(a, c):
            return sum(a[v] * torch.log(a[v] / c[v]) for v in range(len(a)))

        if name == "forward_kl":
            values.append(kl(p, q))
        elif name == "reverse_kl":
            values.append(kl(q, p))
        elif name == "jsd":
            m = weight * p + (1 - weight) * q
            values.append(kl(p, q) if weight == 0 else kl(q, p) if weight == 1
                          else weight * kl(p, m) + (1 - weight) * kl(q, m))
        elif name == "skew_forward_kl":
            values.append(kl(p, weight * p + (1 - weight) * q))
        elif name == "skew_reverse_kl":
            values.append(kl(q, weight * q + (1 - weight) * p))
        elif name == "tvd":
            values.append(0.5 * sum(abs(p[v] - q[v]) for v in range(len(p))))
        elif name == "akl":  # head: the most probable tokens while their running sum stays <= μ, and the first
            mu = 0.5 if weight is None else weight
            order = sorted(range(len(p)), key=lambda v: -p[v].item())
            head = {v for rank, v in enumerate(order) if rank == 0 or sum(p[u].item() for u in order[:rank + 1]) <= mu}
            g_head = sum((p[v] - q[v].detach()).abs() for v in head)  # constants for the student only,
            g_tail = sum((p[v] - q[v].detach()).abs() for v in range(len(p)) if v not in head)  # as the authors
            values.append((g_head * kl(p, q) + g_tail * kl(q, p)) / (g_head + g_tail))
        elif name == "abkd":  # the general case of the α-β divergence
            a, c = (weight or {}).get("alpha", 0.2), (weight or {}).get("beta", 0.7)
            values.append(-sum(p[v] ** a * q[v] ** c - a / (a + c) * p[v] ** (a + c) - c / (a + c) * q[v] ** (a + c)
                               for v in range(len(p))) / (a * c))
        elif name == "distillm2_student_kl":  # the student's share of the mixture is a constant
            alpha = 0.1 if weight is None else weight
            values.append(kl(q, (1 - alpha) * p + alpha * q.detach()))
        else:
            raise AssertionError(f"no reference for the declared divergence {name!r}: write its textbook "
                                 "formula here and its cases in VALUES")
    return sum(values) / len(values)


# (parameter value, temperature) per declared divergence; CASES covers every declaration of the catalogue, so
# a new divergence without values here (and a formula in reference) is a failing case, not a skipped one
VALUES = {"forward_kl": [(None, 1.0)], "reverse_kl": [(None, 2.5)], "tvd": [(None, 1.0)],
          "jsd": [(0.0, 2.5), (0.1, 1.0), (0.5, 2.5), (0.9, 1.0), (1.0, 1.0)],
          "skew_forward_kl": [(0.1, 2.5), (0.0, 1.0)], "skew_reverse_kl": [(0.1, 1.0), (0.5, 2.5)],
          "akl": [(None, 1.0), (0.3, 2.0)], "abkd": [({"alpha": 0.2, "beta": 0.7}, 1.0), ({"alpha": 1.5, "beta": 0.4}, 2.0)],
          "distillm2_student_kl": [(0.1, 1.0), (0.3, 2.5)]}
CASES = [(name, weight, temperature) for name in sorted(token_divergences(targets=False))
         for weight, temperature in VALUES.get(name, [(None, 1.0)])]


@pytest.mark.parametrize("name,weight,temperature", CASES)
def test_each_divergence_equals_the_float64_reference_in_value_and_gradient(name, weight, temperature):
    s, t, labels = logits()
    keep = labels != -100
    value = ours(name, s, t, weight, temperature, keep)
    expected = reference(name, s, t, weight, temperature, keep)
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-14)
    for got, want in zip(torch.autograd.grad(value, (s, t)), torch.autograd.grad(expected, (s, t))):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


def test_identities_of_the_papers():
    s, t, _ = logits(seed=1)
    fkl, rkl = L.forward_kl_loss(s, t), L.reverse_kl_loss(s, t)
    for temperature in (1.0, 4.0):  # Hinton's KD is τ² times the forward KL
        torch.testing.assert_close(L.kd_loss(s, t, temperature),
                                   temperature**2 * L.forward_kl_loss(s, t, temperature))
    torch.testing.assert_close(L.jsd_loss(s, t, 0.0), fkl)  # GKD / TRL endpoints
    torch.testing.assert_close(L.jsd_loss(s, t, 1.0), rkl)
    torch.testing.assert_close(L.skew_forward_kl_loss(s, t, 0.0), fkl)  # DistiLLM: α = 0 is the plain KL
    torch.testing.assert_close(L.skew_reverse_kl_loss(s, t, 0.0), rkl)
    for name in token_divergences(targets=False):  # zero at q = p, and only there
        assert token_divergence(t, t, name, **named(name, 0.5)).abs() < 1e-14
        assert token_divergence(s, t, name, **named(name, 0.5)) > 1e-3
    # JSD(β) ≤ the generalized JSD bound: β KL(p‖m) + (1−β) KL(q‖m) ≤ -β log β - (1-β) log(1-β) ≤ log 2
    beta = 0.3
    bound = -(beta * math.log(beta) + (1 - beta) * math.log(1 - beta))
    per_token = L.jsd_loss(s, t, beta, reduction="none")
    assert per_token.max() <= bound + 1e-12
    # Pinsker: TVD ≤ sqrt(KL / 2), token by token
    tvd = L.tvd_loss(s, t, reduction="none")
    assert (tvd <= (L.forward_kl_loss(s, t, reduction="none") / 2).sqrt() + 1e-12).all()


def test_weights_outside_the_unit_interval_and_unknown_names_are_errors():
    s, t, _ = logits()
    for name, (fn, parameter) in WEIGHTED.items():
        for bad in (-0.1, 1.5, "0.5", None):
            with pytest.raises(KdcollapseError, match=rf"{parameter} of {name} must be a number in \[0, 1\]"):
                fn(s, t, bad)
    with pytest.raises(KdcollapseError, match="unknown divergence 'js'.*Valid choices: .*forward_kl, jsd"):
        token_divergence(s, t, "js")
    with pytest.raises(KdcollapseError, match="'dkd' needs the target token of every row"):
        token_divergence(s, t, "dkd")
    with pytest.raises(KdcollapseError, match="temperature"):
        L.forward_kl_loss(s, t, 0.0)


def test_extreme_logits_give_finite_values_and_gradients():
    s, t, _ = logits(scale=400.0)  # probabilities of exactly 0 in float64
    for name, weight, _ in CASES:
        value = ours(name, s, t, weight, 1.0, None)
        grads = torch.autograd.grad(value, (s, t))
        assert torch.isfinite(value) and all(torch.isfinite(g).all() for g in grads), name


# --- the official code, transcribed literally ----------------------------------------------------------

# huggingface/trl @ f2cd57710ae345ea6428ae95363267fcf38a3dc8, trl/experimental/gkd/gkd_trainer.py,
# GKDTrainer.generalized_jsd_loss (reduction "batchmean", num_items_in_batch None).
def trl_generalized_jsd_loss(student_logits, teacher_logits, labels=None, beta=0.5, temperature=1.0,
                             reduction="batchmean"):
    student_logits = student_logits / temperature
    teacher_logits = teacher_logits / temperature
    student_log_probs = F.log_softmax(student_logits, dim=-1)
    teacher_log_probs = F.log_softmax(teacher_logits, dim=-1)
    if beta == 0:
        jsd = F.kl_div(student_log_probs, teacher_log_probs, reduction="none", log_target=True)
    elif beta == 1:
        jsd = F.kl_div(teacher_log_probs, student_log_probs, reduction="none", log_target=True)
    else:
        beta = torch.tensor(beta, dtype=student_log_probs.dtype, device=student_log_probs.device)
        mixture_log_probs = torch.logsumexp(
            torch.stack([student_log_probs + torch.log1p(-beta), teacher_log_probs + torch.log(beta)]),
            dim=0,
        )
        kl_teacher = F.kl_div(mixture_log_probs, teacher_log_probs, reduction="none", log_target=True)
        kl_student = F.kl_div(mixture_log_probs, student_log_probs, reduction="none", log_target=True)
        jsd = beta * kl_teacher + (1 - beta) * kl_student
    if labels is not None:
        mask = labels != -100
        jsd = jsd[mask]
    if reduction == "batchmean":
        denom = mask.sum().clamp_min(1) if labels is not None else max(jsd.size(0), 1)
        return jsd.sum() / denom
    raise NotImplementedError(reduction)


# jongwooko/distillm @ d47e77ff9d27721783b32213be38c1204230cc0a, distillm/losses.py (dtype=torch.float32
# there; a parameter here).
def distillm_forward_kl(logits, teacher_logits, no_model_batch, dtype):
    teacher_probs = F.softmax(teacher_logits, dim=-1, dtype=dtype)
    inf_mask = torch.isinf(logits)
    student_logprobs = F.log_softmax(logits, dim=-1, dtype=dtype)
    prod_probs = torch.masked_fill(teacher_probs * student_logprobs, inf_mask, 0)
    x = torch.sum(prod_probs, dim=-1).view(-1)
    mask = (no_model_batch["label"] != -100).int()
    distil_loss = -torch.sum(x * mask.view(-1), dim=0) / torch.sum(mask.view(-1), dim=0)
    return distil_loss


def distillm_reverse_kl(logits, teacher_logits, no_model_batch, dtype):
    student_probs = F.softmax(logits, dim=-1, dtype=dtype)
    student_logprobs = F.log_softmax(logits, dim=-1, dtype=dtype)
    teacher_logprobs = F.log_softmax(teacher_logits, dim=-1, dtype=dtype)
    inf_mask = torch.isinf(teacher_logits) | torch.isinf(logits)
    prod_probs = torch.masked_fill(student_probs * teacher_logprobs, inf_mask, 0)
    prod_probs -= torch.masked_fill(student_probs * student_logprobs, inf_mask, 0)
    x = torch.sum(prod_probs, dim=-1).view(-1)
    mask = (no_model_batch["label"] != -100).int()
    distil_loss = -torch.sum(x * mask.view(-1), dim=0) / torch.sum(mask.view(-1), dim=0)
    return distil_loss


def distillm_tv_distance(logits, teacher_logits, no_model_batch, dtype):
    teacher_probs = F.softmax(teacher_logits, dim=-1, dtype=dtype)
    student_probs = F.softmax(logits, dim=-1, dtype=dtype)
    mask = (no_model_batch["label"] != -100).int()
    inf_mask = torch.isinf(logits) | torch.isinf(teacher_logits)
    prod_probs = 0.5 * torch.masked_fill(torch.abs(teacher_probs - student_probs), inf_mask, 0)
    x = torch.sum(prod_probs, dim=-1).view(-1)
    distil_loss = torch.sum(x * mask.view(-1), dim=0) / torch.sum(mask.view(-1), dim=0)
    return distil_loss


def distillm_skewed_forward_kl(logits, teacher_logits, no_model_batch, lam, dtype):
    teacher_probs = F.softmax(teacher_logits, dim=-1, dtype=dtype)
    student_probs = F.softmax(logits, dim=-1, dtype=dtype)
    mixed_probs = lam * teacher_probs + (1 - lam) * student_probs
    mixed_logprobs = torch.log(mixed_probs)
    mask = (no_model_batch["label"] != -100).int()
    inf_mask = torch.isinf(logits) | torch.isinf(teacher_logits)
    prod_probs = torch.masked_fill(teacher_probs * mixed_logprobs, inf_mask, 0)
    x = torch.sum(prod_probs, dim=-1).view(-1)
    distil_loss = -torch.sum(x * mask.view(-1), dim=0) / torch.sum(mask.view(-1), dim=0)
    return distil_loss


def distillm_skewed_reverse_kl(logits, teacher_logits, no_model_batch, lam, dtype):
    teacher_probs = F.softmax(teacher_logits, dim=-1, dtype=dtype)
    student_probs = F.softmax(logits, dim=-1, dtype=dtype)
    mixed_probs = (1 - lam) * teacher_probs + lam * student_probs
    student_logprobs = F.log_softmax(logits, dim=-1, dtype=dtype)
    mixed_logprobs = torch.log(mixed_probs)
    mask = (no_model_batch["label"] != -100).int()
    inf_mask = torch.isinf(logits) | torch.isinf(teacher_logits)
    prod_probs = torch.masked_fill(student_probs * mixed_logprobs, inf_mask, 0)
    prod_probs -= torch.masked_fill(student_probs * student_logprobs, inf_mask, 0)
    x = torch.sum(prod_probs, dim=-1).view(-1)
    distil_loss = -torch.sum(x * mask.view(-1), dim=0) / torch.sum(mask.view(-1), dim=0)
    return distil_loss


# pytorch/torchtune @ bd2a0fc7c31430972728494fa01aaeeb0ebf1ba1, torchtune/modules/loss/kd_losses.py,
# ForwardKLLoss.forward and ReverseKLLoss.forward (normalize=True, ignore_index=-100), dtype as above.
def torchtune_forward_kl(student_logits, teacher_logits, labels, dtype, ignore_index=-100):
    teacher_prob = F.softmax(teacher_logits, dim=-1, dtype=dtype)
    inf_mask = torch.isinf(student_logits)
    student_logprob = F.log_softmax(student_logits, dim=-1, dtype=dtype)
    prod_probs = torch.masked_fill(teacher_prob * student_logprob, inf_mask, 0)
    x = torch.sum(prod_probs, dim=-1).view(-1)
    mask = (labels != ignore_index).int()
    sum_masks = torch.sum(mask.view(-1), dim=0)
    if sum_masks == 0:
        return torch.tensor(0.0, device=x.device)
    return -torch.sum(x * mask.view(-1), dim=0) / torch.sum(mask.view(-1), dim=0)


def torchtune_reverse_kl(student_logits, teacher_logits, labels, dtype, ignore_index=-100):
    student_prob = F.softmax(student_logits, dim=-1, dtype=dtype)
    student_logprob = F.log_softmax(student_logits, dim=-1, dtype=dtype)
    teacher_logprob = F.log_softmax(teacher_logits, dim=-1, dtype=dtype)
    inf_mask = torch.isinf(student_logits) | torch.isinf(teacher_logits)
    prod_probs = torch.masked_fill(student_prob * teacher_logprob, inf_mask, 0)
    prod_probs -= torch.masked_fill(student_prob * student_logprob, inf_mask, 0)
    x = torch.sum(prod_probs, dim=-1).view(-1)
    mask = (labels != ignore_index).int()
    if torch.sum(mask.view(-1), dim=0) == 0:
        return torch.tensor(0.0, device=x.device)
    return -torch.sum(x * mask.view(-1), dim=0) / torch.sum(mask.view(-1), dim=0)


def teacher_entropy(t, keep):
    """Mean teacher entropy over kept tokens: DistiLLM's and torchtune's forward KLs are the cross-entropy
    −Σ p log q, i.e. KL(p ‖ q) + H(p) (same gradient in the student, a constant more in value); DistiLLM's
    skewed forward KL likewise is KL(p ‖ m) + H(p)."""
    log_p = F.log_softmax(t, -1)
    return -(log_p.exp() * log_p).sum(-1)[keep].mean()


def assert_same(ours_value, official, s, offset=0.0):
    torch.testing.assert_close(ours_value, official + offset, rtol=1e-12, atol=1e-13)
    (g_ours,) = torch.autograd.grad(ours_value, s, retain_graph=True)
    (g_official,) = torch.autograd.grad(official, s, retain_graph=True)
    torch.testing.assert_close(g_ours, g_official, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("beta", [0.0, 0.1, 0.5, 0.9, 1.0])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_jsd_equals_trl_generalized_jsd_loss(beta, temperature):
    s, t, labels = logits(seed=2)
    official = trl_generalized_jsd_loss(s, t, labels, beta=beta, temperature=temperature)
    value = L.jsd_loss(s, t, beta, temperature, mask=labels != -100)
    assert_same(value, official, s)
    # and in the teacher's logits too
    torch.testing.assert_close(torch.autograd.grad(value, t)[0], torch.autograd.grad(official, t)[0],
                               rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("lam", [0.1, 0.5])
def test_divergences_equal_distillm_losses(lam):
    s, t, labels = logits(seed=3)
    keep, batch, f64 = labels != -100, {"label": labels}, torch.float64
    entropy = teacher_entropy(t, keep).detach()
    assert_same(L.forward_kl_loss(s, t, mask=keep), distillm_forward_kl(s, t, batch, f64), s, -entropy)
    assert_same(L.reverse_kl_loss(s, t, mask=keep), distillm_reverse_kl(s, t, batch, f64), s)
    assert_same(L.tvd_loss(s, t, mask=keep), distillm_tv_distance(s, t, batch, f64), s)
    assert_same(L.skew_forward_kl_loss(s, t, lam, mask=keep), distillm_skewed_forward_kl(s, t, batch, lam, f64),
                s, -entropy)
    assert_same(L.skew_reverse_kl_loss(s, t, lam, mask=keep), distillm_skewed_reverse_kl(s, t, batch, lam, f64),
                s)


def test_forward_and_reverse_kl_equal_torchtune_kd_losses():
    s, t, labels = logits(seed=4)
    keep, f64 = labels != -100, torch.float64
    flat_s, flat_t = s.reshape(-1, V), t.reshape(-1, V)  # torchtune takes (batch·tokens, V)
    entropy = teacher_entropy(t, keep).detach()
    assert_same(L.forward_kl_loss(s, t, mask=keep), torchtune_forward_kl(flat_s, flat_t, labels, f64), s, -entropy)
    assert_same(L.reverse_kl_loss(s, t, mask=keep), torchtune_reverse_kl(flat_s, flat_t, labels, f64), s)
