"""Slow, obviously-correct references for the losses, written straight from the papers' definitions.

Loops over samples (and classes where it keeps the formula visible); float64 callers get exact
comparisons. ``ikl_pairwise`` is the official O(B·K²) form and also the baseline of
``benchmarks/bench_ikl.py``.
"""

from __future__ import annotations

import math

import torch


def kl(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """KL(p ‖ q) of two probability vectors."""
    return (p * (p.log() - q.log())).sum()


def kd(student, teacher, temperature):
    """τ² · mean over samples of KL(softmax(t/τ) ‖ softmax(s/τ))."""
    terms = [kl(torch.softmax(t / temperature, 0), torch.softmax(s / temperature, 0))
             for s, t in zip(student, teacher)]
    return temperature**2 * torch.stack(terms).mean()


def tckd_nckd(student_row, teacher_row, label, temperature):
    """(TCKD, NCKD, p_t of the teacher) for one sample, from the DKD paper's definitions."""
    p_s = torch.softmax(student_row / temperature, 0)
    p_t = torch.softmax(teacher_row / temperature, 0)
    others = [k for k in range(len(p_s)) if k != label]
    b_s = torch.stack([p_s[label], p_s[others].sum()])
    b_t = torch.stack([p_t[label], p_t[others].sum()])
    hat_s = p_s[others] / p_s[others].sum()
    hat_t = p_t[others] / p_t[others].sum()
    return kl(b_t, b_s), kl(hat_t, hat_s), p_t[label]


def dkd(student, teacher, target, alpha, beta, temperature):
    terms = []
    for s, t, y in zip(student, teacher, target.tolist()):
        tckd, nckd, _ = tckd_nckd(s, t, y, temperature)
        terms.append(alpha * tckd + beta * nckd)
    return temperature**2 * torch.stack(terms).mean()


def _clamped_sigmoid(x):
    return torch.sigmoid(x).clamp(1e-8, 1 - 1e-8)


def binary_kl_clamped(student, teacher, temperature):
    """The official BinaryKL (DHKD eq. 1): probabilities clamped to [1e-8, 1 − 1e-8], sum / B."""
    q_t, q_s = _clamped_sigmoid(teacher / temperature), _clamped_sigmoid(student / temperature)
    kl_ = q_t * torch.log(q_t / q_s) + (1 - q_t) * torch.log((1 - q_t) / (1 - q_s))
    return temperature**2 * kl_.sum() / student.shape[0]


def binary_kl_norm_clamped(student, teacher, temperature):
    """The official BinaryKL-Norm (DHKD eq. 5): KL([½, ½] ‖ [σ(u), 1 − σ(u)]), σ clamped, sum / B."""
    q = _clamped_sigmoid((student - teacher) / temperature)
    kl_ = 0.5 * torch.log(0.5 / q) + 0.5 * torch.log(0.5 / (1 - q))
    return temperature**2 * kl_.sum() / student.shape[0]


def ikl_pairwise(student, teacher, weights, mse_weight=1.0, ce_weight=1.0, temperature=1.0):
    """DKL paper eq. 10 as the official code computes it: a B×K×K tensor of pair differences.

    ``weights`` (B, K) are used as given (the caller detaches them); the soft labels are detached.
    """
    delta_t = teacher.unsqueeze(2) - teacher.unsqueeze(1)
    delta_s = student.unsqueeze(2) - student.unsqueeze(1)
    pair_weights = weights.unsqueeze(2) * weights.unsqueeze(1)
    wmse = 0.25 * ((delta_t - delta_s).pow(2) * pair_weights).sum((1, 2))
    soft = torch.softmax(teacher / temperature, -1).detach()
    ce = -(soft * torch.log_softmax(student / temperature, -1)).sum(-1)
    return (mse_weight * wmse + ce_weight * ce).mean()


def cross_entropy(logits, target):
    return torch.stack([-torch.log_softmax(z, 0)[y] for z, y in zip(logits, target.tolist())]).mean()


def trades(natural, adversarial, target, beta):
    """CE(nat, y) + β·(1/B)·Σ_b KL(P_nat ‖ P_adv); no gradient stopped."""
    kl_sum = sum(kl(torch.softmax(n, 0), torch.softmax(a, 0)) for n, a in zip(natural, adversarial))
    return cross_entropy(natural, target) + beta * kl_sum / natural.shape[0]


def _smooth_l1(x, y):
    d = abs(x - y)
    return 0.5 * d * d if d < 1 else d - 0.5


def _unit(v):
    n = v.norm()
    return v / n if n > 0 else v * 0


def rkd(student, teacher, distance_weight, angle_weight):
    """RKD-D + RKD-A with explicit loops over pairs and triplets (teacher detached)."""
    teacher = teacher.detach()
    b = student.shape[0]

    def distances(e):
        d = [[(e[i] - e[j]).norm() for j in range(b)] for i in range(b)]
        positive = [x for row in d for x in row if x > 0]
        mean = sum(positive) / len(positive)
        return [[x / mean for x in row] for row in d]

    def angle(e, i, j, k):
        return (_unit(e[j] - e[i]) * _unit(e[k] - e[i])).sum()

    d_s, d_t = distances(student), distances(teacher)
    dist_loss = sum(_smooth_l1(d_s[i][j], d_t[i][j]) for i in range(b) for j in range(b)) / b**2
    angle_loss = sum(_smooth_l1(angle(student, i, j, k), angle(teacher, i, j, k))
                     for i in range(b) for j in range(b) for k in range(b)) / b**3
    return distance_weight * dist_loss + angle_weight * angle_loss


def tuplet(anchor, positive, negatives, temperature):
    """−log exp(a·p/τ) / (exp(a·p/τ) + Σ_k exp(a·n_k/τ)) for one anchor, in plain Python floats."""
    def unit(v):
        n = math.sqrt(sum(x * x for x in v))
        return [x / n for x in v]

    def dot(u, v):
        return sum(x * y for x, y in zip(unit(u), unit(v))) / temperature

    pos = math.exp(dot(anchor, positive))
    return -math.log(pos / (pos + sum(math.exp(dot(anchor, n)) for n in negatives)))
