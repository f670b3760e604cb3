"""NKD, WTTM, logit standardization and MLKD's correlation losses against literal transcriptions of
their official code (float64, values and gradients), and the papers' identities."""

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import kdcollapse.losses as L

B, K = 6, 7


def logits(seed, b=B, k=K, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    s, t = (scale * torch.randn(2, b, k, generator=g, dtype=torch.float64)).unbind()
    return s.requires_grad_(), t.requires_grad_(), torch.randint(0, k, (b,), generator=g)


def assert_same(ours, official, inputs):
    """Values and gradients w.r.t. every input equal to 1e-10 (float64)."""
    torch.testing.assert_close(ours, official, rtol=1e-10, atol=1e-12)
    for g, g_ref in zip(torch.autograd.grad(ours, inputs, allow_unused=True, materialize_grads=True),
                        torch.autograd.grad(official, inputs, allow_unused=True, materialize_grads=True)):
        torch.testing.assert_close(g, g_ref, rtol=1e-10, atol=1e-12)


# --- official code, transcribed literally ----------------------------------------------------------

def official_nkd(logit_s, logit_t, gt_label, temp, gamma):
    """yzd-v/cls_KD @ 1e5d48f36957ee460d39d7ebc592c6cc7f8f3d66, mmcls/models/dis_losses/nkd.py,
    NKDLoss.forward."""
    label = gt_label.view(len(gt_label), 1)
    N, c = logit_s.shape
    s_i = F.log_softmax(logit_s, dim=1)
    t_i = F.softmax(logit_t, dim=1)
    s_t = torch.gather(s_i, 1, label)
    t_t = torch.gather(t_i, 1, label).detach()
    loss_t = - (t_t * s_t).mean()
    mask = torch.ones_like(logit_s).scatter_(1, label, 0).bool()
    logit_s = logit_s[mask].reshape(N, -1)
    logit_t = logit_t[mask].reshape(N, -1)
    S_i = F.log_softmax(logit_s / temp, dim=1)
    T_i = F.softmax(logit_t / temp, dim=1)
    loss_non = (T_i * S_i).sum(dim=1).mean()
    loss_non = - gamma * (temp**2) * loss_non
    return loss_t + loss_non


def official_wttm(y_s, y_t, l):
    """zkxufo/TTM @ fe457b33a71ba27536ec04fe3d32c5b04963522f, distiller_zoo/wttm.py, WTTM.forward."""
    p_s = F.log_softmax(y_s, dim=1)
    p_t = torch.pow(torch.softmax(y_t, dim=1), l)
    norm = torch.sum(p_t, dim=1)
    p_t = p_t / norm.unsqueeze(1)
    KL = torch.sum(F.kl_div(p_s, p_t, reduction='none'), dim=1)
    return torch.mean(norm * KL)


def official_normalize(logit):
    """sunshangquan/logit-standardization-KD @ f6e5aa5172bad618e801163c3385322eea673754,
    mdistiller/distillers/KD.py, normalize."""
    mean = logit.mean(dim=-1, keepdims=True)
    stdv = logit.std(dim=-1, keepdims=True)
    return (logit - mean) / (1e-7 + stdv)


def official_kd(logits_student_in, logits_teacher_in, temperature, logit_stand):
    """Same repository and commit, mdistiller/distillers/KD.py, kd_loss."""
    logits_student = official_normalize(logits_student_in) if logit_stand else logits_student_in
    logits_teacher = official_normalize(logits_teacher_in) if logit_stand else logits_teacher_in
    log_pred_student = F.log_softmax(logits_student / temperature, dim=1)
    pred_teacher = F.softmax(logits_teacher / temperature, dim=1)
    loss_kd = F.kl_div(log_pred_student, pred_teacher, reduction="none").sum(1).mean()
    loss_kd *= temperature**2
    return loss_kd


def official_dkd(logits_student_in, logits_teacher_in, target, alpha, beta, temperature, logit_stand):
    """Same repository and commit, mdistiller/distillers/DKD.py, dkd_loss (with its helpers)."""
    logits_student = official_normalize(logits_student_in) if logit_stand else logits_student_in
    logits_teacher = official_normalize(logits_teacher_in) if logit_stand else logits_teacher_in
    gt_mask = torch.zeros_like(logits_student).scatter_(1, target.reshape(-1).unsqueeze(1), 1).bool()
    other_mask = torch.ones_like(logits_student).scatter_(1, target.reshape(-1).unsqueeze(1), 0).bool()

    def cat_mask(t, mask1, mask2):
        return torch.cat([(t * mask1).sum(dim=1, keepdims=True), (t * mask2).sum(1, keepdims=True)], dim=1)

    pred_student = cat_mask(F.softmax(logits_student / temperature, dim=1), gt_mask, other_mask)
    pred_teacher = cat_mask(F.softmax(logits_teacher / temperature, dim=1), gt_mask, other_mask)
    log_pred_student = torch.log(pred_student)
    tckd_loss = (F.kl_div(log_pred_student, pred_teacher, reduction="sum") * (temperature**2)
                 / target.shape[0])
    pred_teacher_part2 = F.softmax(logits_teacher / temperature - 1000.0 * gt_mask, dim=1)
    log_pred_student_part2 = F.log_softmax(logits_student / temperature - 1000.0 * gt_mask, dim=1)
    nckd_loss = (F.kl_div(log_pred_student_part2, pred_teacher_part2, reduction="sum")
                 * (temperature**2) / target.shape[0])
    return alpha * tckd_loss + beta * nckd_loss


def official_cc(logits_student, logits_teacher, temperature):
    """Jin-Ying/Multi-Level-Logit-Distillation @ 5ee473fcf193dfb00a0598b64d0acfe6ad58a482,
    mdistiller/distillers/KD_ours.py, cc_loss (reduce=True)."""
    batch_size, class_num = logits_teacher.shape
    pred_student = F.softmax(logits_student / temperature, dim=1)
    pred_teacher = F.softmax(logits_teacher / temperature, dim=1)
    student_matrix = torch.mm(pred_student.transpose(1, 0), pred_student)
    teacher_matrix = torch.mm(pred_teacher.transpose(1, 0), pred_teacher)
    return ((teacher_matrix - student_matrix) ** 2).sum() / class_num


def official_bc(logits_student, logits_teacher, temperature):
    """Same repository and commit, bc_loss (reduce=True)."""
    batch_size, class_num = logits_teacher.shape
    pred_student = F.softmax(logits_student / temperature, dim=1)
    pred_teacher = F.softmax(logits_teacher / temperature, dim=1)
    student_matrix = torch.mm(pred_student, pred_student.transpose(1, 0))
    teacher_matrix = torch.mm(pred_teacher, pred_teacher.transpose(1, 0))
    return ((teacher_matrix - student_matrix) ** 2).sum() / batch_size


# --- equal to the official code -------------------------------------------------------------------

@pytest.mark.parametrize("temperature,gamma", [(1.0, 1.5), (4.0, 0.5)])
def test_nkd_equals_official(temperature, gamma):
    s, t, y = logits(0)
    assert_same(L.nkd_loss(s, t, y, temperature, gamma), official_nkd(s, t, y, temperature, gamma), (s, t))


@pytest.mark.parametrize("gamma", [0.1, 0.2, 0.5, 1.0])
def test_wttm_equals_official(gamma):
    s, t, _ = logits(1)
    assert_same(L.wttm_loss(s, t, gamma), official_wttm(s, t, gamma), (s, t))


def test_standardized_kd_and_dkd_equal_official():
    s, t, y = logits(2)
    z = L.standardize_logits
    torch.testing.assert_close(z(s), official_normalize(s), rtol=0, atol=0)
    assert_same(L.kd_loss(z(s), z(t), 2.0), official_kd(s, t, 2.0, True), (s, t))
    # student gradients only: the official -1000 mask gives teacher probabilities exactly 0 in
    # float64, whose KL gradient w.r.t. the teacher is NaN (the official teacher has none)
    assert_same(L.dkd_loss(z(s), z(t), y, 9.0, 72.0, 2.0), official_dkd(s, t, y, 9.0, 72.0, 2.0, True), (s,))


@pytest.mark.parametrize("temperature", [1.0, 4.0])
def test_mlkd_correlations_equal_official(temperature):
    s, t, _ = logits(3)
    assert_same(L.class_correlation_loss(s, t, temperature), official_cc(s, t, temperature), (s, t))
    assert_same(L.batch_correlation_loss(s, t, temperature), official_bc(s, t, temperature), (s, t))


# --- identities -------------------------------------------------------------------------------

def test_wttm_at_gamma_one_is_kd_at_temperature_one_and_weights_flat_teachers_more():
    s, t, _ = logits(4)
    torch.testing.assert_close(L.wttm_loss(s, t, 1.0), L.kd_loss(s, t, 1.0), rtol=1e-12, atol=1e-12)
    # per sample: U_γ(p_t)·KL(softmax(γ z_t) ‖ softmax(z_s)) (the power transform is a temperature 1/γ)
    gamma = 0.3
    u = torch.softmax(t, 1).pow(gamma).sum(1)
    kl = [L.kd_loss(s[i:i + 1], gamma * t[i:i + 1], 1.0) for i in range(B)]
    torch.testing.assert_close(L.wttm_loss(s, t, gamma, reduction="none"), u * torch.stack(kl))
    flat, peaked = torch.zeros(1, K, dtype=torch.float64), torch.eye(K, dtype=torch.float64)[:1] * 20
    assert torch.softmax(flat, 1).pow(gamma).sum() > torch.softmax(peaked, 1).pow(gamma).sum()


def test_nkd_is_target_ce_plus_normalized_non_target_ce():
    """NKD eq. 8 written from the paper: −T_t log S_t − γτ²·Σ_{j≠t} T̂_j log Ŝ_j per sample."""
    s, t, y = logits(5)
    tau, gamma = 2.0, 1.5
    terms = []
    for i in range(B):
        p_s, p_t = torch.softmax(s[i], 0), torch.softmax(t[i], 0)
        others = [j for j in range(K) if j != y[i]]
        hat_s, hat_t = torch.softmax(s[i, others] / tau, 0), torch.softmax(t[i, others] / tau, 0)
        terms.append(-p_t[y[i]].detach() * p_s[y[i]].log() - gamma * tau**2 * (hat_t * hat_s.log()).sum())
    torch.testing.assert_close(L.nkd_loss(s, t, y, tau, gamma), torch.stack(terms).mean())


def test_standardization_makes_kd_invariant_to_logit_shift_and_scale():
    """The paper's point (Sec. 3): after the z-score, KD no longer asks the student to match the
    teacher's logit range, only the shape; a shift and a positive scale per sample change nothing."""
    s, t, _ = logits(6)
    z = L.standardize_logits(s)
    torch.testing.assert_close(z.mean(1), torch.zeros(B, dtype=torch.float64), atol=1e-12, rtol=0)
    torch.testing.assert_close(z.std(1), torch.ones(B, dtype=torch.float64), atol=1e-6, rtol=0)
    a, b = torch.rand(B, 1, dtype=torch.float64) * 5 + 0.1, torch.randn(B, 1, dtype=torch.float64)
    torch.testing.assert_close(L.kd_loss(L.standardize_logits(a * s + b), L.standardize_logits(t), 2.0),
                               L.kd_loss(z, L.standardize_logits(t), 2.0), rtol=1e-6, atol=1e-9)


def test_correlations_vanish_when_student_matches_and_are_symmetric_forms():
    s, t, _ = logits(7)
    assert L.class_correlation_loss(t, t).item() == 0 and L.batch_correlation_loss(t, t).item() == 0
    # the class-level and batch-level matrices have the same Frobenius norms of P (trace identity)
    p = torch.softmax(s, 1)
    assert np.isclose((p.T @ p).trace().item(), (p @ p.T).trace().item())
