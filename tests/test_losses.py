"""Logit distillation losses against slow references and the papers' identities (float64)."""

import loss_references as ref
import pytest
import torch
import torch.nn.functional as F

from kdcollapse.losses import (binary_kl_loss, binary_kl_norm_loss, dkd_loss, dkl_loss, ikl_loss,
                               kd_loss)
from kdcollapse.losses.dkl import weighted_pairwise_sq

B, K = 6, 7


def logits(*shape, scale=3.0):
    return (scale * torch.randn(*shape, dtype=torch.float64)).requires_grad_()


def grads(loss, *inputs):
    return torch.autograd.grad(loss, inputs)


def assert_close(actual, expected, **kw):
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12, **kw)


# --- KD and DKD -------------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_kd_matches_reference(temperature):
    s, t = logits(B, K), logits(B, K)
    assert_close(kd_loss(s, t, temperature), ref.kd(s, t, temperature))
    expected = grads(ref.kd(s, t, temperature), s, t)
    for g, g_ref in zip(grads(kd_loss(s, t, temperature), s, t), expected):
        assert_close(g, g_ref)


@pytest.mark.parametrize("alpha,beta,temperature", [(1.0, 8.0, 4.0), (0.5, 2.0, 1.0)])
def test_dkd_matches_paper_definitions(alpha, beta, temperature):
    s, t, y = logits(B, K), logits(B, K), torch.randint(0, K, (B,))
    loss = dkd_loss(s, t, y, alpha, beta, temperature)
    expected = ref.dkd(s, t, y, alpha, beta, temperature)
    assert_close(loss, expected)
    assert_close(grads(loss, s)[0], grads(expected, s)[0])


def test_kd_is_tckd_plus_weighted_nckd():
    """DKD paper: KD = TCKD + (1 − p_t^T)·NCKD per sample, hence DKD(α = β = 1) ≠ KD in general."""
    temperature = 2.0
    for _ in range(4):
        s, t, y = logits(1, K), logits(1, K), torch.randint(0, K, (1,))
        tckd = dkd_loss(s, t, y, alpha=1.0, beta=0.0, temperature=temperature)
        nckd = dkd_loss(s, t, y, alpha=0.0, beta=1.0, temperature=temperature)
        p_target = torch.softmax(t / temperature, -1)[0, y[0]]
        assert_close(kd_loss(s, t, temperature), tckd + (1 - p_target) * nckd)
        assert abs(kd_loss(s, t, temperature) - dkd_loss(s, t, y, 1.0, 1.0, temperature)) > 1e-4


def test_dkd_large_logits():
    # Log-space throughout: probabilities down to e^-600 are still resolved exactly.
    s, t, y = logits(B, K, scale=100.0), logits(B, K, scale=100.0), torch.randint(0, K, (B,))
    assert_close(dkd_loss(s, t, y, 1.0, 1.0, 1.0), ref.dkd(s, t, y, 1.0, 1.0, 1.0))


# --- BinaryKL and BinaryKL-Norm ---------------------------------------------------------------

@pytest.mark.parametrize("fn,official", [(binary_kl_loss, ref.binary_kl_clamped),
                                         (binary_kl_norm_loss, ref.binary_kl_norm_clamped)])
@pytest.mark.parametrize("temperature", [1.0, 2.0])
def test_binary_kl_matches_official_clamped_form(fn, official, temperature):
    s, t = logits(B, K), logits(B, K)  # |z/τ| ≲ 15: the clamp at 1e-8 never binds
    assert_close(fn(s, t, temperature), official(s, t, temperature))
    for g, g_ref in zip(grads(fn(s, t, temperature), s, t), grads(official(s, t, temperature), s, t)):
        torch.testing.assert_close(g, g_ref, rtol=1e-8, atol=1e-12)


def test_binary_kl_norm_minimum_and_gradient():
    temperature = 2.0
    t = logits(B, K)
    s = t.detach().clone().requires_grad_()
    loss = binary_kl_norm_loss(s, t, temperature)
    assert loss.item() == 0.0
    assert torch.count_nonzero(grads(loss, s)[0]) == 0
    s = logits(B, K)
    u = (s - t) / temperature
    # L = τ²/B Σ KL(u), ∂KL/∂u = σ(u) − ½, ∂u/∂z_s = 1/τ
    assert_close(grads(binary_kl_norm_loss(s, t, temperature), s)[0],
                 temperature * (torch.sigmoid(u) - 0.5).detach() / B)


@pytest.mark.parametrize("fn", [binary_kl_loss, binary_kl_norm_loss])
def test_binary_kl_finite_at_huge_logits(fn):
    big = 1e4
    s = torch.tensor([[big, -big, big, 0.0]], requires_grad=True)
    t = torch.tensor([[-big, big, big, 0.0]], requires_grad=True)
    loss = fn(s, t, 2.0)
    g_s, g_t = grads(loss, s, t)
    assert torch.isfinite(loss) and torch.isfinite(g_s).all() and torch.isfinite(g_t).all()
    # Two classes with opposite saturated signs (z_s = ±1e4 = −z_t), each KL ≈ |z_s|/τ for BinaryKL
    # and ≈ |z_s − z_t|/(2τ) − log 2 for the Norm: both ≈ τ·1e4 after the τ² factor.
    torch.testing.assert_close(loss.detach(), torch.tensor(2 * 2.0 * big), rtol=1e-3, atol=0)
    # ∂/∂z_s = τ·(σ(s) − σ(t)) for BinaryKL, τ·(σ(u) − ½) for the Norm: ±τ on the opposed classes
    expected = torch.tensor([[2.0, -2.0, 0.0, 0.0]]) * (0.5 if fn is binary_kl_norm_loss else 1.0)
    torch.testing.assert_close(g_s, expected)


def test_dhkd_propositions_1_and_2():
    """Autograd's gradient of CE + α·BinaryKL on a linear head equals the pull/push decomposition.

    DHKD §3.2: for the batch-summed loss, −∂L/∂w_k = F_w-pull^CE + αF_w-pull^BKL + F_w-push^CE +
    αF_w-push^BKL and −∂L/∂h = F_h-pull^CE + αF_h-pull^BKL + F_h-push^CE + αF_h-push^BKL, with
    p = softmax(Wh), q^S_k = σ(w_k·h/τ) and q^T_k = σ(z^T_k/τ) for the frozen teacher's logits.
    """
    n, d, k, alpha, tau = 12, 5, 4, 0.7, 2.0
    h = torch.randn(n, d, dtype=torch.float64, requires_grad=True)
    w = torch.randn(k, d, dtype=torch.float64, requires_grad=True)
    z_teacher = 3 * torch.randn(n, k, dtype=torch.float64)
    y = torch.arange(n) % k
    z = h @ w.T
    loss = n * (F.cross_entropy(z, y) + alpha * binary_kl_loss(z, z_teacher, tau))  # Σ over the batch
    g_h, g_w = grads(loss, h, w)

    p = torch.softmax(z, -1).detach()
    q_s, q_t = torch.sigmoid(z / tau).detach(), torch.sigmoid(z_teacher / tau)
    hd = h.detach()
    for c in range(k):
        own, other = y == c, y != c
        pull_ce = ((1 - p[own, c])[:, None] * hd[own]).sum(0)
        push_ce = -(p[other, c][:, None] * hd[other]).sum(0)
        pull_bkl = tau * ((q_t[own, c] - q_s[own, c])[:, None] * hd[own]).sum(0)
        push_bkl = -tau * ((q_s[other, c] - q_t[other, c])[:, None] * hd[other]).sum(0)
        assert_close(-g_w[c], pull_ce + alpha * pull_bkl + push_ce + alpha * push_bkl)
    wd = w.detach()
    for i in range(n):
        c, others = y[i], torch.arange(k) != y[i]
        pull_ce = (1 - p[i, c]) * wd[c]
        push_ce = -(p[i, others][:, None] * wd[others]).sum(0)
        pull_bkl = tau * (q_t[i, c] - q_s[i, c]) * wd[c]
        push_bkl = -tau * ((q_s[i, others] - q_t[i, others])[:, None] * wd[others]).sum(0)
        assert_close(-g_h[i], pull_ce + alpha * pull_bkl + push_ce + alpha * push_bkl)


# --- DKL and IKL ------------------------------------------------------------------------------

def _kl_m_n(m, n):
    """KL(softmax(m) ‖ softmax(n)), mean over samples, no gradient stopped."""
    log_m = torch.log_softmax(m, -1)
    return (log_m.exp() * (log_m - torch.log_softmax(n, -1))).sum(-1).mean()


def test_dkl_lemma_1_gradients_equal_kl():
    """DKL paper Lemma 1: with α = β = 1, ∇ DKL(m, n) = ∇ KL(s_m ‖ s_n) w.r.t. m *and* n.

    m is the reference side o_m (teacher / natural image), n the side being fitted o_n.
    """
    m, n = logits(B, K), logits(B, K)
    for g, g_kl in zip(grads(dkl_loss(m, n), m, n), grads(_kl_m_n(m, n), m, n)):
        assert_close(g, g_kl)
    # The wMSE alone drives m and the CE alone drives n: α and β scale them separately.
    g_m, g_n = grads(dkl_loss(m, n, alpha=2.0, beta=3.0), m, n)
    g_m_kl, g_n_kl = grads(_kl_m_n(m, n), m, n)
    assert_close(g_m, 2.0 * g_m_kl)
    assert_close(g_n, 3.0 * g_n_kl)


def test_weighted_pairwise_identity():
    a, w = torch.randn(5, K, dtype=torch.float64), torch.rand(5, K, dtype=torch.float64)
    pairwise = (w[:, :, None] * w[:, None, :] * (a[:, :, None] - a[:, None, :]) ** 2).sum((1, 2))
    assert_close(weighted_pairwise_sq(a, w), pairwise)
    assert weighted_pairwise_sq(a, torch.zeros_like(w)).eq(0).all()  # no 0/0 for all-zero weights


@pytest.mark.parametrize("use_class_weights", [False, True])
@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_ikl_matches_pairwise_form(use_class_weights, temperature):
    s, t, y = logits(B, K), logits(B, K), torch.randint(0, K, (B,))
    kw = dict(mse_weight=8.0, ce_weight=2.0, temperature=temperature)
    if use_class_weights:
        table = torch.rand(K, K, dtype=torch.float64)
        table = table / table.sum(1, keepdim=True)
        loss = ikl_loss(s, t, class_weights=table, target=y, **kw)
        expected = ref.ikl_pairwise(s, t, table[y], **kw)
    else:
        loss = ikl_loss(s, t, **kw)
        expected = ref.ikl_pairwise(s, t, torch.softmax(t, -1).detach(), **kw)
    assert_close(loss, expected)
    # Breaking asymmetry: the teacher side receives the wMSE gradient too.
    for g, g_ref in zip(grads(loss, s, t), grads(expected, s, t)):
        assert_close(g, g_ref)


def test_ikl_sequence_with_mask_matches_pairwise_form():
    b, steps = 3, 5
    s, t = logits(b, steps, K), logits(b, steps, K)
    y, mask = torch.randint(0, K, (b, steps)), torch.rand(b, steps) < 0.6
    mask[0, 0] = True
    table = torch.softmax(torch.randn(K, K, dtype=torch.float64), -1)
    loss = ikl_loss(s, t, class_weights=table, target=y, mse_weight=3.0, mask=mask)
    expected = ref.ikl_pairwise(s[mask], t[mask], table[y[mask]], mse_weight=3.0)
    assert_close(loss, expected)
    for g, g_ref in zip(grads(loss, s, t), grads(expected, s, t)):
        assert_close(g, g_ref)


def test_ikl_centred_form_is_stable_in_float32():
    """A large common offset between teacher and student logits cancels in the wMSE; the centred
    O(K) form keeps float32 accuracy where the expanded variance form loses it."""
    a = (1e4 + 0.1 * torch.randn(B, 1000)).double().requires_grad_()  # a = t − s, exact in float32
    w = torch.softmax(torch.randn(B, 1000, dtype=torch.float64), -1).float().double()
    exact = weighted_pairwise_sq(a, w)
    g_exact = grads(exact.sum(), a)[0]
    a32 = a.detach().float().requires_grad_()
    centred = weighted_pairwise_sq(a32, w.float())
    torch.testing.assert_close(centred.double(), exact.detach(), rtol=1e-4, atol=0)
    torch.testing.assert_close(grads(centred.sum(), a32)[0].double(), g_exact, rtol=1e-4, atol=1e-7)
    a32, w32 = a32.detach(), w.float()
    expanded = 2 * (w32.sum(-1) * (w32 * a32 * a32).sum(-1) - (w32 * a32).sum(-1) ** 2)
    assert ((expanded.double() - exact).abs() / exact).max() > 1e-2  # what the centring avoids
