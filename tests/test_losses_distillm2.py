"""DistiLLM-2's contrastive objective (Ko et al., ICML 2025) against the official trainer's loss on identical
inputs, a token-by-token reference, its identities, and the fused-head path.

The official code computes in the model's dtype; here everything is float64."""

import math

import pytest
import torch
import torch.nn.functional as F

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError
from kdcollapse.losses.distillm2 import distillm2_fused_loss, distillm2_rows
from token_cases import FORMS, assert_fused_equals, head_case

P, T, V = 3, 7, 13  # P prompts, each with a teacher and a student response


def batch(seed=0):
    """Concatenated chosen (teacher-written) and rejected (student-written) sequences, as the official
    ``concatenated_forward`` builds them: labels -100 on each prompt and on padding."""
    g = torch.Generator().manual_seed(seed)
    s, t = (2 * torch.randn(2, 2 * P, T, V, generator=g, dtype=torch.float64)).unbind()
    labels = torch.randint(0, V, (2 * P, T), generator=g)
    prompt = [2, 1, 3, 2, 1, 3]
    pad = [0, 2, 0, 1, 0, 0]
    for i in range(2 * P):
        labels[i, :prompt[i]] = -100
        if pad[i]:
            labels[i, -pad[i]:] = -100
    return s.requires_grad_(), t, labels


# jongwooko/distillm-2 @ fe4cf9bfbb4f83219dd1d69219800164b59685fa, file jongwooko/distillm-2/src/distillm_trainer.py:
# DistiLLMTrainer.get_batch_logps (loss_type "distillm_v2", logp_logq = logq_logp = None as the trainer starts
# and keeps them with update_alpha = False, so the adaptive-α ``try`` fails into alpha = base_alpha; the
# torch.OutOfMemoryError retries repeat the same lines and are left out), then concatenated_forward's split,
# kd_loss ("distillm_v2", gradual_beta False: beta = 1.0) and get_batch_loss_metrics' losses.mean().
def official_get_batch_logps(logits, tea_logits, labels, average_log_prob=True, label_pad_token_id=-100,
                             base_alpha_1=0.1, base_alpha_2=0.1):
    labels = labels[:, 1:].clone()
    logits = logits[:, :-1, :]
    tea_logits = tea_logits[:, :-1, :]
    loss_mask = labels != label_pad_token_id
    labels[labels == label_pad_token_id] = 0
    vocab_logps = logits.log_softmax(-1)
    per_token_logps = torch.gather(vocab_logps, dim=2, index=labels.unsqueeze(2)).squeeze(2)
    tea_vocab_logps = tea_logits.log_softmax(-1)
    tea_per_token_logps = torch.gather(tea_vocab_logps, dim=2, index=labels.unsqueeze(2)).squeeze(2)
    alpha_1 = base_alpha_1
    log_alpha_1, log_one_minus_alpha_1 = math.log(alpha_1), math.log(1 - alpha_1)
    mix_vocab_logps = torch.logsumexp(
        torch.stack([log_alpha_1 + tea_vocab_logps, log_one_minus_alpha_1 + vocab_logps], dim=0), dim=0)
    tea_pos_kl = (tea_vocab_logps.exp() * (tea_vocab_logps - mix_vocab_logps)).sum(-1)
    alpha_2 = base_alpha_2
    log_alpha_2, log_one_minus_alpha_2 = math.log(alpha_2), math.log(1 - alpha_2)
    mix_vocab_logps = torch.logsumexp(
        torch.stack([log_one_minus_alpha_2 + tea_vocab_logps, log_alpha_2 + vocab_logps.detach()], dim=0), dim=0)
    ref_pos_kl = (vocab_logps.exp() * (vocab_logps - mix_vocab_logps)).sum(-1)
    return (
        (per_token_logps * loss_mask).sum(-1) / loss_mask.sum(-1),
        (tea_per_token_logps * loss_mask).sum(-1) / loss_mask.sum(-1),
        (tea_pos_kl * loss_mask).sum(-1) / loss_mask.sum(-1),
        (ref_pos_kl * loss_mask).sum(-1) / loss_mask.sum(-1) if ref_pos_kl is not None else None,
    )


def official_distillm_v2(all_logits, tea_all_logits, labels, len_chosen, alpha=0.1):
    all_logps, tea_all_logps, tea_pos_kl, ref_pos_kl = official_get_batch_logps(
        all_logits, tea_all_logits, labels, base_alpha_1=alpha, base_alpha_2=alpha)
    chosen_position_kl = tea_pos_kl[:len_chosen]
    rejected_position_kl = ref_pos_kl[len_chosen:]
    beta = 1.0
    losses = (2 - beta) * chosen_position_kl + beta * rejected_position_kl
    return losses.mean()


def ours(s, t, labels, alpha=0.1, reduction="sequence"):
    shifted = L.shift_for_causal_lm(s, t, labels)
    student_response = torch.arange(2 * P) >= P
    return L.distillm2_loss(shifted.student, shifted.teacher, student_response, alpha, mask=shifted.mask,
                            reduction=reduction)


@pytest.mark.parametrize("alpha", [0.1, 0.3])
@pytest.mark.parametrize("seed", [0, 1])
def test_distillm2_equals_the_official_trainer_loss_in_value_and_gradient(alpha, seed):
    s, t, labels = batch(seed)
    official = official_distillm_v2(s, t, labels, P, alpha)
    value = ours(s, t, labels, alpha)
    torch.testing.assert_close(value, official, rtol=1e-12, atol=1e-14)
    (got,), (want,) = torch.autograd.grad(value, (s,)), torch.autograd.grad(official, (s,))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)


def reference_rows(s, t, student_response, alpha):
    """Token by token on explicit probabilities; the student's share of the student-side mixture is a constant."""
    rows = []
    for z_s, z_t, own in zip(s, t, student_response):
        q, p = F.softmax(z_s, -1), F.softmax(z_t, -1)
        if own:
            m = (1 - alpha) * p + alpha * q.detach()
            rows.append(sum(q[v] * torch.log(q[v] / m[v]) for v in range(len(q))))
        else:
            m = alpha * p + (1 - alpha) * q
            rows.append(sum(p[v] * torch.log(p[v] / m[v]) for v in range(len(q))))
    return torch.stack(rows)


def test_token_mean_equals_the_reference_and_the_sides_are_the_skew_kls():
    s, t, labels = batch(2)
    shifted = L.shift_for_causal_lm(s, t, labels)
    own = (torch.arange(2 * P) >= P).unsqueeze(1).expand(2 * P, T - 1)
    keep = shifted.mask
    value = ours(s, t, labels, 0.2, reduction="mean")
    expected = reference_rows(shifted.student[keep], shifted.teacher[keep], own[keep], 0.2).mean()
    torch.testing.assert_close(value, expected, rtol=1e-12, atol=1e-14)
    (got,), (want,) = torch.autograd.grad(value, (s,)), torch.autograd.grad(expected, (s,))
    torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-13)
    # the teacher side is the registered skew forward KL; the student side has the skew reverse KL's value
    # (its mixture's student share is only held fixed in the gradient)
    a, c = shifted.student.detach(), shifted.teacher
    teacher_rows = L.distillm2_loss(a, c, torch.zeros(2 * P, dtype=torch.bool), 0.2, mask=keep)
    torch.testing.assert_close(teacher_rows, L.skew_forward_kl_loss(a, c, 0.2, mask=keep))
    student_rows = L.distillm2_loss(a, c, torch.ones(2 * P, dtype=torch.bool), 0.2, mask=keep)
    torch.testing.assert_close(student_rows, L.skew_reverse_kl_loss(a, c, 0.2, mask=keep))
    # … but not its gradient: the plain skew reverse KL differentiates through αq in the mixture
    x = a.clone().requires_grad_()
    g_ours = torch.autograd.grad(L.distillm2_loss(x, c, torch.ones(2 * P, dtype=torch.bool), 0.2, mask=keep), x)[0]
    g_plain = torch.autograd.grad(L.skew_reverse_kl_loss(x, c, 0.2, mask=keep), x)[0]
    assert (g_ours - g_plain).abs().max() > 1e-4


def test_identities():
    s, t, labels = batch(3)
    shifted = L.shift_for_causal_lm(s, t, labels)
    a, c, keep = shifted.student.detach(), shifted.teacher, shifted.mask
    own = torch.arange(2 * P) >= P
    # α = 0: forward KL on the teacher's responses, reverse KL on the student's
    log_q, log_p = F.log_softmax(a, -1), F.log_softmax(c, -1)
    rows = distillm2_rows(log_q, log_p, own.unsqueeze(1).expand(2 * P, T - 1), 0.0)
    forward = (log_p.exp() * (log_p - log_q)).sum(-1)
    reverse = (log_q.exp() * (log_q - log_p)).sum(-1)
    torch.testing.assert_close(rows, torch.where(own.unsqueeze(1), reverse, forward))
    # zero at q = p on both sides
    assert L.distillm2_loss(c, c, own, 0.1, mask=keep).abs() < 1e-14
    # the sequence reduction with every sequence equally long is twice the token mean over equal halves
    full = torch.ones(2 * P, T - 1, dtype=torch.bool)
    torch.testing.assert_close(L.distillm2_loss(a, c, own, mask=full, reduction="sequence"),
                               2 * L.distillm2_loss(a, c, own, mask=full))


def test_bad_inputs_are_one_error_each():
    s, t, labels = batch()
    a, c = s.detach()[:, :-1], t[:, :-1]
    with pytest.raises(KdcollapseError, match=r"student_response must be a bool tensor"):
        L.distillm2_loss(a, c, torch.ones(2 * P))
    with pytest.raises(KdcollapseError, match=r"student_response must have shape \(6, 6\) or \(6,\)"):
        L.distillm2_loss(a, c, torch.ones(5, dtype=torch.bool))
    with pytest.raises(KdcollapseError, match=r"alpha of distillm2 \(the skew\) must be a number in \[0, 1\]"):
        L.distillm2_loss(a, c, torch.ones(2 * P, dtype=torch.bool), 1.5)
    with pytest.raises(KdcollapseError, match="one student_response flag per sequence"):
        L.distillm2_loss(a, c, torch.eye(6, dtype=torch.bool), reduction="sequence")
    with pytest.raises(KdcollapseError, match=r"needs \(B, T, K\) logits"):
        L.distillm2_loss(a[0], c[0], torch.ones(6, dtype=torch.bool), reduction="sequence")


@pytest.mark.parametrize("form", FORMS)
def test_fused_distillm2_equals_the_unfused_token_mean(form):
    case, temperature = head_case(21, [1, 8, 15]), 1.5
    own = torch.arange(21) % 3 == 0
    teacher, keep, z, labels = case.teacher(form, temperature), case.keep, case.student_logits, case.labels
    log_p = (teacher.log_probs(slice(None), case.vocab, temperature).double() if form.startswith("top-k")
             else F.log_softmax(case.teacher_logits / temperature, -1))
    distill = distillm2_rows(F.log_softmax(z / temperature, -1), log_p, own, 0.1)[keep].mean()
    ce = F.cross_entropy(z[keep & ~own], labels[keep & ~own], reduction="sum") / keep.sum()
    expected = distill + 0.5 * ce
    assert_fused_equals(lambda chunk: distillm2_fused_loss(case.hidden, case.weight, teacher, own, 0.1, temperature,
                                                           labels=labels, ce_weight=0.5, chunk_size=chunk),
                        expected, case)
