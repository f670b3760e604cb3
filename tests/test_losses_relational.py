"""Contrastive, relational and adversarial-training losses against hand computations and slow loops."""

import math

import loss_references as ref
import pytest
import torch

from kdcollapse.losses import ikl_at_loss, intra_class_contrastive_loss, rkd_loss, trades_loss


def assert_close(actual, expected):
    torch.testing.assert_close(actual, expected, rtol=1e-10, atol=1e-12)


def grads(loss, *inputs, retain_graph=False):
    return torch.autograd.grad(loss, inputs, retain_graph=retain_graph)


# --- intra-class contrastive ------------------------------------------------------------------

def test_contrastive_hand_computation():
    # anchor (1, 0), positive (0.6, 0.8), negatives (0, 1) and (−1, 0), τ = 0.5, unnormalised inputs
    anchors = torch.tensor([[3.0, 0.0]], dtype=torch.float64)
    positives = torch.tensor([[1.2, 1.6]], dtype=torch.float64)
    negatives = torch.tensor([[[0.0, 5.0], [-2.0, 0.0]]], dtype=torch.float64)
    by_hand = -math.log(math.exp(1.2) / (math.exp(1.2) + math.exp(0.0) + math.exp(-2.0)))
    loss = intra_class_contrastive_loss(anchors, positives, negatives, temperature=0.5)
    assert loss.item() == pytest.approx(by_hand, rel=1e-14)


def test_contrastive_matches_reference_and_masks():
    b, m, d, tau = 5, 4, 3, 0.7
    a, p, n = (torch.randn(*shape, dtype=torch.float64, requires_grad=True)
               for shape in [(b, d), (b, d), (b, m, d)])
    mask = torch.rand(b, m) < 0.5
    mask[0] = False  # an anchor with no valid negatives contributes exactly 0
    mask[1] = True
    loss = intra_class_contrastive_loss(a, p, n, negative_mask=mask, temperature=tau)
    per_anchor = [ref.tuplet(a[i].tolist(), p[i].tolist(), n[i][mask[i]].tolist(), tau)
                  for i in range(b)]
    assert per_anchor[0] == 0.0
    assert loss.item() == pytest.approx(sum(per_anchor) / b, rel=1e-12)
    # Masked negatives change nothing: replace them by anything and the loss and gradients stay.
    n2 = torch.where(mask[..., None], n, 100 * torch.randn_like(n)).detach().requires_grad_()
    loss2 = intra_class_contrastive_loss(a, p, n2, negative_mask=mask, temperature=tau)
    assert_close(loss2, loss)
    g, g2 = grads(loss, a, p, n), grads(loss2, a, p, n2)
    for x, y in zip(g, g2):
        assert_close(x, y)
    assert g2[2][~mask].eq(0).all()
    # With every negative valid, no mask and an all-True mask agree.
    full = torch.ones(b, m, dtype=torch.bool)
    assert_close(intra_class_contrastive_loss(a, p, n, full, tau),
                 intra_class_contrastive_loss(a, p, n, None, tau))


# --- RKD --------------------------------------------------------------------------------------

def test_rkd_matches_triple_loop():
    s = torch.randn(5, 4, dtype=torch.float64, requires_grad=True)
    t = torch.randn(5, 6, dtype=torch.float64, requires_grad=True)
    loss = rkd_loss(s, t, distance_weight=25.0, angle_weight=50.0)
    expected = ref.rkd(s, t, 25.0, 50.0)
    assert_close(loss, expected)
    assert_close(grads(loss, s, retain_graph=True)[0], grads(expected, s)[0])
    loss.backward()
    assert t.grad is None  # the teacher side carries no gradient


def test_rkd_coincident_points_and_weights():
    s = torch.randn(5, 4, dtype=torch.float64)
    s[3] = s[1]  # two identical embeddings: zero difference vector, angle 0 like the reference
    s.requires_grad_()
    t = torch.randn(5, 3, dtype=torch.float64)
    loss = rkd_loss(s, t, 1.0, 0.0)
    assert_close(loss, ref.rkd(s, t, 1.0, 0.0))
    assert_close(rkd_loss(s, t, 0.0, 1.0), ref.rkd(s, t, 0.0, 1.0))
    assert torch.isfinite(grads(rkd_loss(s, t), s)[0]).all()


# --- TRADES and IKL-AT ------------------------------------------------------------------------

def test_trades_matches_reference():
    b, k = 6, 5
    nat, adv = (3 * torch.randn(b, k, dtype=torch.float64)).requires_grad_(), \
        (3 * torch.randn(b, k, dtype=torch.float64)).requires_grad_()
    y = torch.randint(0, k, (b,))
    loss, expected = trades_loss(nat, adv, y, beta=6.0), ref.trades(nat, adv, y, 6.0)
    assert_close(loss, expected)
    for g, g_ref in zip(grads(loss, nat, adv), grads(expected, nat, adv)):
        assert_close(g, g_ref)


@pytest.mark.parametrize("use_class_weights", [True, False])
def test_ikl_at_matches_reference(use_class_weights):
    """CE(nat, y) + IKL: natural = teacher side (not detached in the wMSE), adversarial = student."""
    b, k = 6, 5
    nat, adv = (3 * torch.randn(b, k, dtype=torch.float64)).requires_grad_(), \
        (3 * torch.randn(b, k, dtype=torch.float64)).requires_grad_()
    y = torch.randint(0, k, (b,))
    table = torch.softmax(torch.randn(k, k, dtype=torch.float64), -1) if use_class_weights else None
    loss = ikl_at_loss(nat, adv, y, table, mse_weight=20.0, ce_weight=4.0)
    weights = table[y] if use_class_weights else torch.softmax(nat, -1).detach()
    expected = ref.cross_entropy(nat, y) + ref.ikl_pairwise(adv, nat, weights, 20.0, 4.0, 1.0)
    assert_close(loss, expected)
    g_nat, g_adv = grads(loss, nat, adv)
    for g, g_ref in zip((g_nat, g_adv), grads(expected, nat, adv)):
        assert_close(g, g_ref)
    # The natural logits get more than the CE gradient: the wMSE reaches them (breaking asymmetry).
    g_ce = grads(ref.cross_entropy(nat, y), nat)[0]
    assert (g_nat - g_ce).abs().max() > 1e-3
