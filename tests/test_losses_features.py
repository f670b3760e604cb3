"""Feature-map and relation losses (FitNet, AT, OFD, DIST, NST, SP, PKT) against their official code and the papers.

Each ``official_*`` function below is a literal transcription of the official computation, kept
independent of the package (only torch, numpy and scipy), with its source:

* mdistiller: github.com/megvii-research/mdistiller at a08d46f10d6102bd6e3f258ca5ac880b020ea259,
  ``mdistiller/distillers/FitNet.py``, ``AT.py``, ``OFD.py``, ``NST.py``, ``SP.py``, ``PKT.py``;
* DIST: github.com/hunto/image_classification_sota at d9662f7df68fe46b973c4580b7c9b896cedcd301 (the
  commit hunto/DIST_KD pins as its ``classification`` submodule), ``lib/models/losses/dist_kd.py``.

Values and gradients are compared in float64 to 1e-10 relative (the operations are the same up to
summation order); the papers' identities are checked beside them.
"""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from scipy.stats import norm

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import (at_loss, attention_map, dist_loss, fitnet_loss, nst_loss, ofd_loss,
                               ofd_margin, pearson_correlation, pkt_loss, sp_loss)

TOL = dict(rtol=1e-10, atol=1e-12)


def rand(*shape, seed=0, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (scale * torch.randn(*shape, generator=g, dtype=torch.float64)).requires_grad_()


def assert_same(ours, theirs, inputs):
    """Equal values, and equal gradients with respect to every input that has one."""
    torch.testing.assert_close(ours, theirs, **TOL)
    wanted = [x for x in inputs if x.requires_grad]
    g_ours = torch.autograd.grad(ours, wanted, allow_unused=True)
    g_theirs = torch.autograd.grad(theirs, wanted, allow_unused=True)
    for a, b in zip(g_ours, g_theirs):
        if b is None:
            assert a is None or a.eq(0).all()
        else:
            torch.testing.assert_close(a, b, **TOL)


# --- official computations, transcribed --------------------------------------------------------

def official_fitnet(f_s_regressed, f_t):
    # FitNet.forward_train: F.mse_loss(self.conv_reg(feature_student[...]), feature_teacher[...]),
    # the teacher computed under torch.no_grad().
    return F.mse_loss(f_s_regressed, f_t.detach())


def official_at(g_s, g_t, p):
    # AT.py: at_loss / single_stage_at_loss, verbatim in structure.
    def _at(feat, p):
        return F.normalize(feat.pow(p).mean(1).reshape(feat.size(0), -1))

    def single(f_s, f_t, p):
        s_H, t_H = f_s.shape[2], f_t.shape[2]
        if s_H > t_H:
            f_s = F.adaptive_avg_pool2d(f_s, (t_H, t_H))
        elif s_H < t_H:
            f_t = F.adaptive_avg_pool2d(f_t, (s_H, s_H))
        return (_at(f_s, p) - _at(f_t, p)).pow(2).mean()

    return sum([single(f_s, f_t.detach(), p) for f_s, f_t in zip(g_s, g_t)])


def official_ofd_margins(bn_weight, bn_bias):
    # OFD.init_ofd_modules: per channel, with scipy's norm.cdf, in Python floats.
    margin = []
    for s, m in zip(bn_weight.tolist(), bn_bias.tolist()):
        s = abs(s)
        if norm.cdf(-m / s) > 0.001:
            margin.append(-s * math.exp(-((m / s) ** 2) / 2) / math.sqrt(2 * math.pi) / norm.cdf(-m / s) + m)
        else:
            margin.append(-3 * s)
    return torch.tensor(margin, dtype=torch.float64)


def official_ofd_feat_loss(source, target, margin):
    # OFD.py: feat_loss, with the margin of shape (1, C, 1, 1).
    margin = margin.to(source)
    loss = (
        (source - margin) ** 2 * ((source > margin) & (target <= margin)).float()
        + (source - target) ** 2 * ((source > target) & (target > margin) & (target <= 0)).float()
        + (source - target) ** 2 * (target > 0).float()
    )
    return torch.abs(loss).mean(dim=0).sum()


def official_ofd(feature_student, feature_teacher, margins):
    # OFD.ofd_loss after the connectors: teacher pooled to the student's size, stage i weighted 2^-(n-1-i).
    loss_distill = 0
    feat_num = len(feature_student)
    for i in range(feat_num):
        loss_distill = loss_distill + official_ofd_feat_loss(
            feature_student[i],
            F.adaptive_avg_pool2d(feature_teacher[i], feature_student[i].shape[-2:]).detach(),
            margins[i].view(1, -1, 1, 1),
        ) / 2 ** (feat_num - i - 1)
    return loss_distill


def official_dist(z_s, z_t, beta, gamma, tau):
    # dist_kd.py: cosine_similarity, pearson_correlation, inter/intra_class_relation, DIST.forward.
    def cosine_similarity(a, b, eps=1e-8):
        return (a * b).sum(1) / (a.norm(dim=1) * b.norm(dim=1) + eps)

    def pearson(a, b, eps=1e-8):
        return cosine_similarity(a - a.mean(1).unsqueeze(1), b - b.mean(1).unsqueeze(1), eps)

    def inter_class_relation(y_s, y_t):
        return 1 - pearson(y_s, y_t).mean()

    def intra_class_relation(y_s, y_t):
        return inter_class_relation(y_s.transpose(0, 1), y_t.transpose(0, 1))

    y_s = (z_s / tau).softmax(dim=1)
    y_t = (z_t / tau).softmax(dim=1)
    inter_loss = tau**2 * inter_class_relation(y_s, y_t)
    intra_loss = tau**2 * intra_class_relation(y_s, y_t)
    return beta * inter_loss + gamma * intra_loss


def official_nst(g_s, g_t):
    # NST.py: nst_loss / single_stage_nst_loss / poly_kernel.
    def poly_kernel(a, b):
        a = a.unsqueeze(1)
        b = b.unsqueeze(2)
        return (a * b).sum(-1).pow(2)

    def single(f_s, f_t):
        s_H, t_H = f_s.shape[2], f_t.shape[2]
        if s_H > t_H:
            f_s = F.adaptive_avg_pool2d(f_s, (t_H, t_H))
        elif s_H < t_H:
            f_t = F.adaptive_avg_pool2d(f_t, (s_H, s_H))
        f_s = F.normalize(f_s.view(f_s.shape[0], f_s.shape[1], -1), dim=2)
        f_t = F.normalize(f_t.view(f_t.shape[0], f_t.shape[1], -1), dim=2)
        return poly_kernel(f_t, f_t).mean().detach() + poly_kernel(f_s, f_s).mean() - 2 * poly_kernel(f_s, f_t).mean()

    return sum([single(f_s, f_t.detach()) for f_s, f_t in zip(g_s, g_t)])


def official_sp(f_s, f_t):
    # SP.py: similarity_loss.
    bsz = f_s.shape[0]
    f_s = f_s.view(bsz, -1)
    f_t = f_t.detach().view(bsz, -1)
    G_s = torch.nn.functional.normalize(torch.mm(f_s, torch.t(f_s)))
    G_t = torch.nn.functional.normalize(torch.mm(f_t, torch.t(f_t)))
    G_diff = G_t - G_s
    return (G_diff * G_diff).view(-1, 1).sum(0) / (bsz * bsz)


def official_pkt(f_s, f_t, eps=1e-7):
    # PKT.py: pkt_loss (its in-place NaN repair, f[f != f] = 0, is a no-op on finite inputs).
    f_t = f_t.detach()
    f_s = f_s / (torch.sqrt(torch.sum(f_s**2, dim=1, keepdim=True)) + eps)
    f_t = f_t / (torch.sqrt(torch.sum(f_t**2, dim=1, keepdim=True)) + eps)
    model_similarity = (torch.mm(f_s, f_s.transpose(0, 1)) + 1.0) / 2.0
    target_similarity = (torch.mm(f_t, f_t.transpose(0, 1)) + 1.0) / 2.0
    model_similarity = model_similarity / torch.sum(model_similarity, dim=1, keepdim=True)
    target_similarity = target_similarity / torch.sum(target_similarity, dim=1, keepdim=True)
    return torch.mean(target_similarity * torch.log((target_similarity + eps) / (model_similarity + eps)))


# --- FitNet -------------------------------------------------------------------------------------

def test_fitnet_equals_official():
    s, t = rand(6, 8, 4, 4, seed=1), rand(6, 8, 4, 4, seed=2)
    assert_same(fitnet_loss(s, t), official_fitnet(s, t), [s, t])


def test_fitnet_is_the_mean_squared_error_by_hand_and_rejects_other_shapes():
    s = torch.zeros(1, 1, 1, 2, dtype=torch.float64)
    t = torch.tensor([[[[1.0, 3.0]]]], dtype=torch.float64)
    assert fitnet_loss(s, t).item() == pytest.approx(5.0, rel=1e-15)  # (1 + 9) / 2
    with pytest.raises(KdcollapseError, match="one shape"):
        fitnet_loss(torch.zeros(1, 2, 2, 2), torch.zeros(1, 3, 2, 2))


# --- AT -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("sizes", [[(8, 8), (4, 4)], [(8, 4), (4, 2)], [(4, 8), (2, 4)]])
@pytest.mark.parametrize("p", [2.0, 4.0])
def test_at_equals_official(sizes, p):
    """Post-ReLU maps (as mdistiller reads), different channels, and stages where the student's map is
    larger, smaller or equal to the teacher's."""
    s_sizes, t_sizes = zip(*sizes)
    g_s = [rand(5, 3 + i, h, h, seed=i).relu().detach().requires_grad_() for i, h in enumerate(s_sizes)]
    g_t = [rand(5, 6, h, h, seed=10 + i).relu().detach() for i, h in enumerate(t_sizes)]
    assert_same(at_loss(g_s, g_t, p), official_at(g_s, g_t, p), g_s)


def test_at_for_even_p_does_not_depend_on_signs():
    """|A|^p = A^p for even p: the official expression on signed maps too."""
    g_s, g_t = [rand(4, 3, 4, 4, seed=1)], [rand(4, 5, 4, 4, seed=2)]
    assert_same(at_loss(g_s, g_t, 2.0), official_at(g_s, g_t, 2.0), g_s)


def test_attention_map_is_the_normalised_channel_mean_of_powers():
    """AT eq. 1-2 by hand: one sample, two channels, a 1×2 map."""
    a = torch.tensor([[[[1.0, 2.0]], [[3.0, 0.0]]]], dtype=torch.float64)
    q = torch.tensor([(1 + 9) / 2, (4 + 0) / 2], dtype=torch.float64)
    torch.testing.assert_close(attention_map(a, 2.0), (q / q.norm()).view(1, 2), **TOL)
    # Unit norm per sample, invariant to a positive rescaling of the activations.
    x = rand(3, 4, 5, 5).detach()
    torch.testing.assert_close(attention_map(x).norm(dim=1), torch.ones(3, dtype=torch.float64), **TOL)
    torch.testing.assert_close(attention_map(7 * x), attention_map(x), **TOL)


def test_at_is_zero_for_proportional_maps_and_pairs_stages():
    x = rand(2, 3, 4, 4).detach()
    assert at_loss(x, 5 * x.repeat(1, 2, 1, 1)).item() == pytest.approx(0, abs=1e-15)
    with pytest.raises(KdcollapseError, match="stage by stage"):
        at_loss([x, x], [x])


# --- OFD ----------------------------------------------------------------------------------------

def test_ofd_margin_equals_official():
    g = torch.Generator().manual_seed(3)
    weight = torch.randn(64, generator=g, dtype=torch.float64)
    bias = 2 * torch.randn(64, generator=g, dtype=torch.float64)
    bias[:4] = torch.tensor([4.0, 8.0, -8.0, 0.0]) * weight[:4].abs()  # both sides of the 0.001 rule
    official = official_ofd_margins(weight, bias)
    assert (official[:2] == -3 * weight[:2].abs()).all()  # P(x < 0) ≤ 0.001 at β = 4σ, 8σ
    torch.testing.assert_close(ofd_margin(weight, bias), official, rtol=1e-12, atol=1e-12)


def test_ofd_margin_is_the_mean_of_the_negative_part_of_a_gaussian():
    """Monte Carlo: E[x | x < 0] for x ~ N(β, γ²), 10⁶ draws, within 5 standard errors."""
    g = torch.Generator().manual_seed(0)
    for std, mean in [(1.0, 0.0), (2.0, 1.5), (0.5, -1.0), (1.0, 2.5)]:
        x = mean + std * torch.randn(1_000_000, generator=g, dtype=torch.float64)
        negative = x[x < 0]
        estimate, error = negative.mean().item(), negative.std().item() / math.sqrt(len(negative))
        margin = ofd_margin(torch.tensor([std], dtype=torch.float64), torch.tensor([mean], dtype=torch.float64))
        assert abs(margin.item() - estimate) < 5 * error, (std, mean)
    # The closed form at β = 0: −σ·√(2/π) (half-normal mean).
    assert ofd_margin(torch.tensor([2.0]), torch.tensor([0.0])).item() == pytest.approx(-2 * math.sqrt(2 / math.pi))
    # γ = 0: the constant channel β.
    torch.testing.assert_close(ofd_margin(torch.zeros(2), torch.tensor([-0.5, 0.5])),
                               torch.tensor([-0.5, 0.0], dtype=torch.float64))


def teacher_like(*shape, seed):
    """Pre-ReLU values with ties at the margin and at 0 (the boundaries of the partial L2)."""
    t = rand(*shape, seed=seed).detach()
    t[:, :, 0, 0] = 0.0
    return t


def test_ofd_equals_official_with_stage_weights_and_pooling():
    margins = [-torch.rand(c, dtype=torch.float64, generator=torch.Generator().manual_seed(c)) for c in (4, 6, 8)]
    s = [rand(3, c, h, h, seed=i) for i, (c, h) in enumerate([(4, 8), (6, 4), (8, 2)])]
    t = [teacher_like(3, c, 2 * h, 2 * h, seed=10 + i) for i, (c, h) in enumerate([(4, 8), (6, 4), (8, 2)])]
    t[2] = teacher_like(3, 8, 2, 2, seed=20)  # the last stage at the student's size already
    t[2][:, :, 1, 1] = margins[2].view(1, -1)  # teacher exactly at the margin
    assert_same(ofd_loss(s, t, margins), official_ofd(s, t, margins), s)


def test_ofd_distance_cases_by_hand():
    """Partial L2 after the margin ReLU, one channel with m = −1, one entry per case of eq. 5."""
    m = torch.tensor([-1.0], dtype=torch.float64)
    cases = [  # (student, teacher, loss)
        (-3.0, -2.0, 0.0),  # t ≤ m, s ≤ m: nothing
        (0.5, -2.0, 2.25),  # t ≤ m, s > m: (s − m)²
        (-0.7, -0.5, 0.0),  # m < t ≤ 0, s ≤ t: nothing
        (0.5, -0.5, 1.0),  # m < t ≤ 0, s > t: (s − t)²
        (-1.0, 1.0, 4.0),  # t > 0: (s − t)² both ways
        (3.0, 1.0, 4.0),
    ]
    for s, t, expected in cases:
        value = ofd_loss(torch.tensor([[[[s]]]], dtype=torch.float64), torch.tensor([[[[t]]]], dtype=torch.float64), m)
        assert value.item() == pytest.approx(expected, abs=1e-15), (s, t)


def test_ofd_rejects_positive_margins_and_mismatched_channels():
    s, t = torch.zeros(1, 2, 2, 2), torch.zeros(1, 2, 2, 2)
    with pytest.raises(KdcollapseError, match="positive"):
        ofd_loss(s, t, torch.tensor([0.5, -1.0]))
    with pytest.raises(KdcollapseError, match="channel"):
        ofd_loss(s, t, torch.tensor([-1.0]))


# --- DIST ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("tau,beta,gamma", [(1.0, 1.0, 1.0), (4.0, 1.0, 1.0), (2.0, 0.5, 2.0)])
def test_dist_equals_official(tau, beta, gamma):
    z_s, z_t = rand(16, 100, seed=1, scale=3), rand(16, 100, seed=2, scale=3)
    assert_same(dist_loss(z_s, z_t, beta, gamma, tau), official_dist(z_s, z_t, beta, gamma, tau), [z_s, z_t])


def test_pearson_correlation_is_numpy_corrcoef():
    a, b = rand(5, 30, seed=1).detach(), rand(5, 30, seed=2).detach()
    expected = [np.corrcoef(x, y)[0, 1] for x, y in zip(a.numpy(), b.numpy())]
    torch.testing.assert_close(pearson_correlation(a, b, eps=0.0), torch.tensor(expected, dtype=torch.float64), **TOL)


def test_dist_only_sees_relations():
    """DIST eq. 5-6: the loss is 0 when the student's probabilities equal the teacher's, and the Pearson
    correlation is invariant to positive affine maps of either argument (DIST §3.2), so the inter-class
    term of ρ(a·y_s + b, y_t) equals that of ρ(y_s, y_t)."""
    z = rand(8, 10, seed=3).detach()
    # Identical inputs: ρ = ‖a‖²/(‖a‖² + eps) per row a of centred probabilities, so the loss is 0 up to
    # eps/‖a‖² (eps = 1e-8 in the official denominators).
    y = torch.softmax(z, 1)
    slack = [(1e-8 / (v - v.mean(1, keepdim=True)).pow(2).sum(1)).mean() for v in (y, y.T)]
    assert 0 <= dist_loss(z, z).item() <= sum(slack).item() * (1 + 1e-6)
    y_s, y_t = torch.softmax(rand(8, 10, seed=4).detach(), 1), torch.softmax(z, 1)
    torch.testing.assert_close(pearson_correlation(3 * y_s + 0.2, 0.5 * y_t - 1, eps=0.0),
                               pearson_correlation(y_s, y_t, eps=0.0), **TOL)
    # A logit shift per sample leaves the softmax, hence the loss, unchanged.
    torch.testing.assert_close(dist_loss(z + rand(8, 1, seed=5).detach(), z), dist_loss(z, z), **TOL)


def test_dist_takes_batches_of_logits_only():
    with pytest.raises(KdcollapseError, match="2 dimensions"):
        dist_loss(torch.zeros(2, 3, 4), torch.zeros(2, 3, 4))


# --- NST, SP, PKT ---------------------------------------------------------------------------------

def test_nst_equals_official():
    g_s = [rand(4, 3, 8, 8, seed=1).relu().detach().requires_grad_(), rand(4, 5, 4, 4, seed=2)]
    g_t = [rand(4, 6, 4, 4, seed=3), rand(4, 7, 8, 8, seed=4)]
    assert_same(nst_loss(g_s, g_t), official_nst(g_s, g_t), g_s)


def test_nst_is_the_distance_of_mean_embeddings():
    """NST eq. 5-6: with k(x, y) = (xᵀy)² = ⟨xxᵀ, yyᵀ⟩_F, MMD² = ‖mean_i t_i t_iᵀ − mean_j s_j s_jᵀ‖²_F
    per image (the channels' unit spatial patterns as samples), averaged over images."""
    s, t = rand(3, 4, 3, 3, seed=5).detach(), rand(3, 6, 3, 3, seed=6).detach()
    expected = []
    for a, b in zip(s.flatten(2), t.flatten(2)):
        a, b = F.normalize(a, dim=1), F.normalize(b, dim=1)
        second_moment = [torch.einsum("ci,cj->ij", x, x) / len(x) for x in (a, b)]
        expected.append((second_moment[1] - second_moment[0]).pow(2).sum())
    torch.testing.assert_close(nst_loss(s, t), torch.stack(expected).mean(), **TOL)
    assert nst_loss(s, 2 * s).abs().item() < 1e-14  # same channels up to scale: no discrepancy


def test_sp_equals_official():
    f_s, f_t = rand(8, 4, 3, 3, seed=1), rand(8, 6, 2, 2, seed=2)
    assert_same(sp_loss(f_s, f_t), official_sp(f_s, f_t)[0], [f_s])


def test_sp_only_sees_the_batch_similarities():
    """SP eq. 2-4: G = F Fᵀ is unchanged by an orthogonal map of the feature space and row normalisation
    removes a common scale, so a rotated, rescaled teacher leaves nothing to learn."""
    f = rand(6, 5, seed=3).detach()
    q, _ = torch.linalg.qr(rand(5, 5, seed=4).detach())
    assert sp_loss(f, 3 * f @ q).item() == pytest.approx(0.0, abs=1e-14)
    assert sp_loss(f, rand(6, 5, seed=5).detach()).item() > 1e-3


def test_pkt_equals_official():
    f_s, f_t = rand(10, 7, seed=1), rand(10, 12, seed=2)
    assert_same(pkt_loss(f_s, f_t), official_pkt(f_s, f_t), [f_s])


def test_pkt_is_zero_when_cosines_agree_and_rejects_bad_shapes():
    """PKT eq. 10-12: p = q when the student's cosine similarities equal the teacher's (an orthogonal map
    and positive per-sample scales keep them)."""
    f = rand(6, 5, seed=3).detach()
    q, _ = torch.linalg.qr(rand(5, 5, seed=4).detach())
    scales = torch.rand(6, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(0)) + 0.5
    assert pkt_loss(scales * f @ q, f).item() == pytest.approx(0.0, abs=1e-9)  # ε terms only
    with pytest.raises(KdcollapseError, match="batch sizes differ"):
        pkt_loss(torch.zeros(3, 2), torch.zeros(4, 2))
