"""Slow, obviously-correct references for the declared losses, written from the papers' definitions: loops
over samples (and pairs, classes), no vectorised trick, no shared helper with the fast code. A declaration
names its reference (``register_loss(..., reference=...)``); the registry-driven contract test
(tests/test_loss_references.py) compares value and the fitted side's gradient in float64 on random inputs.
Each takes the loss's own arguments (what the declaration's ``example`` and ``variants`` pass), with its
defaults.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


def _kl(p: Tensor, q: Tensor) -> Tensor:
    """KL(p ‖ q) of two probability vectors."""
    return (p * (p.log() - q.log())).sum()


def _mean(terms) -> Tensor:
    return torch.stack(list(terms)).mean()


def kd(student: Tensor, teacher: Tensor, temperature: float = 4.0) -> Tensor:
    """τ² · mean over samples of KL(softmax(t/τ) ‖ softmax(s/τ)) (Hinton et al. 2015)."""
    return temperature**2 * _mean(_kl(torch.softmax(t / temperature, 0), torch.softmax(s / temperature, 0))
                                  for s, t in zip(student, teacher))


def _tckd_nckd(s: Tensor, t: Tensor, label: int, temperature: float) -> tuple[Tensor, Tensor]:
    p_s, p_t = torch.softmax(s / temperature, 0), torch.softmax(t / temperature, 0)
    others = [k for k in range(len(p_s)) if k != label]
    b_s = torch.stack([p_s[label], p_s[others].sum()])
    b_t = torch.stack([p_t[label], p_t[others].sum()])
    return _kl(b_t, b_s), _kl(p_t[others] / p_t[others].sum(), p_s[others] / p_s[others].sum())


def dkd(student: Tensor, teacher: Tensor, target: Tensor, alpha: float = 1.0, beta: float = 8.0,
        temperature: float = 4.0) -> Tensor:
    """τ² · mean (α·TCKD + β·NCKD), the binary target/non-target KL and the KL of the renormalised
    non-target distributions (DKD paper eq. 1-5)."""
    terms = []
    for s, t, y in zip(student, teacher, target.tolist()):
        tckd, nckd = _tckd_nckd(s, t, y, temperature)
        terms.append(alpha * tckd + beta * nckd)
    return temperature**2 * _mean(terms)


def _bernoulli_kl(p: float | Tensor, q: Tensor) -> Tensor:
    return p * torch.log(p / q) + (1 - p) * torch.log((1 - p) / (1 - q))


def _sigmoid(x: Tensor, form: str) -> Tensor:
    """σ(x), clamped to [1e-8, 1 − 1e-8] by the official code's form."""
    return torch.sigmoid(x).clamp(1e-8, 1 - 1e-8) if form == "official" else torch.sigmoid(x)


def binary_kl(student: Tensor, teacher: Tensor, temperature: float = 2.0, *, form: str = "stable") -> Tensor:
    """τ² · mean_b Σ_k KL(Bernoulli(σ(t_k/τ)) ‖ Bernoulli(σ(s_k/τ))) (DHKD eq. 1)."""
    return temperature**2 * _mean(
        sum(_bernoulli_kl(_sigmoid(tk / temperature, form), _sigmoid(sk / temperature, form)) for sk, tk in zip(s, t))
        for s, t in zip(student, teacher))


def binary_kl_norm(student: Tensor, teacher: Tensor, temperature: float = 2.0, *, form: str = "stable") -> Tensor:
    """τ² · mean_b Σ_k KL(Bernoulli(½) ‖ Bernoulli(σ((s_k − t_k)/τ))) (DHKD eq. 5)."""
    return temperature**2 * _mean(
        sum(_bernoulli_kl(0.5, _sigmoid((sk - tk) / temperature, form)) for sk, tk in zip(s, t))
        for s, t in zip(student, teacher))


def trades(natural: Tensor, adversarial: Tensor, target: Tensor, beta: float = 6.0) -> Tensor:
    """CE(natural, y) + β·(1/B)·Σ_b KL(softmax(natural_b) ‖ softmax(adversarial_b)) (TRADES eq. 5)."""
    ce = _mean(-torch.log_softmax(z, 0)[y] for z, y in zip(natural, target.tolist()))
    return ce + beta * _mean(_kl(torch.softmax(n, 0), torch.softmax(a, 0)) for n, a in zip(natural, adversarial))


def wttm(student: Tensor, teacher: Tensor, gamma: float = 0.2) -> Tensor:
    """mean_b U·KL(p_t^γ / U ‖ softmax(s)), U = Σ_j p_{t,j}^γ, p_t = softmax(t) (WTTM, Zheng & Yang 2024)."""
    terms = []
    for s, t in zip(student, teacher):
        powered = torch.softmax(t, 0) ** gamma
        u = powered.sum()
        terms.append(u * _kl(powered / u, torch.softmax(s, 0)))
    return _mean(terms)


def nkd(student: Tensor, teacher: Tensor, target: Tensor, temperature: float = 1.0, gamma: float = 1.5) -> Tensor:
    """mean_b [−T_y·log S_y − γ·τ²·Σ_{j≠y} T̂_j log Ŝ_j] (NKD paper eq. 8): T_y the teacher's target probability
    (no gradient), T̂ and Ŝ the softmax over the K − 1 non-target logits at τ."""
    terms = []
    for s, t, y in zip(student, teacher, target.tolist()):
        others = [k for k in range(len(s)) if k != y]
        t_y = torch.softmax(t, 0)[y].detach()
        hat_t, log_hat_s = torch.softmax(t[others] / temperature, 0), torch.log_softmax(s[others] / temperature, 0)
        terms.append(-t_y * torch.log_softmax(s, 0)[y] - gamma * temperature**2 * (hat_t * log_hat_s).sum())
    return _mean(terms)


def fitnet(student_regressed: Tensor, teacher_hint: Tensor) -> Tensor:
    """The mean over every entry of (r(v_s) − u_t)² (FitNets eq. 3, mdistiller's mean reduction)."""
    entries = [(a - b) ** 2 for a, b in zip(student_regressed.flatten(), teacher_hint.detach().flatten())]
    return torch.stack(entries).mean()


def sp(student: Tensor, teacher: Tensor) -> Tensor:
    """(1/B²) Σ_ij (G̃_T − G̃_S)²_ij, G_ij = ⟨f_i, f_j⟩ of the flattened activations, rows of G L2-normalised
    (SP eq. 2-4)."""
    def normalised_gram(f):
        rows = [torch.stack([(a * b).sum() for b in f]) for a in f.flatten(1)]
        return [r / r.norm() for r in rows]

    f_s, f_t = student.flatten(1), teacher.detach().flatten(1)
    g_s, g_t = normalised_gram(f_s), normalised_gram(f_t)
    b = len(f_s)
    return sum(((rt - rs) ** 2).sum() for rs, rt in zip(g_s, g_t)) / b**2


def pkt(student: Tensor, teacher: Tensor, eps: float = 1e-7) -> Tensor:
    """mean_ij p_ij·log((p_ij + ε)/(q_ij + ε)), p_ij = K(t_i, t_j)/Σ_j K(t_i, t_j) with the cosine kernel
    K = (1 + cos)/2 (PKT eq. 10, 12), q the same of the student; the norm takes + ε as the official code."""
    def conditional(f):
        unit = [v / (v.norm() + eps) for v in f]
        rows = [torch.stack([((a * b).sum() + 1) / 2 for b in unit]) for a in unit]
        return torch.stack([r / r.sum() for r in rows])

    q, p = conditional(student), conditional(teacher.detach())
    return (p * torch.log((p + eps) / (q + eps))).mean()


def within_class_cosine(features: Tensor, labels: Tensor) -> Tensor:
    """Mean over the classes present of (1/n_k²) Σ_{i,j in class k} (1 − cos(h_i, h_j)) (Kornblith et al. 2021)."""
    classes = sorted(set(labels.tolist()))
    terms = []
    for k in classes:
        members = [h for h, y in zip(features, labels.tolist()) if y == k]
        pairs = [1 - torch.dot(a, b) / (a.norm() * b.norm()) for a in members for b in members]
        terms.append(torch.stack(pairs).sum() / len(members) ** 2)
    return _mean(terms)


def _smooth_l1(x: Tensor, y: Tensor) -> Tensor:
    d = (x - y).abs()
    return 0.5 * d * d if d < 1 else d - 0.5


def rkd(student_embeddings: Tensor, teacher_embeddings: Tensor, distance_weight: float = 25.0,
        angle_weight: float = 50.0) -> Tensor:
    """RKD-D + RKD-A (Park et al. 2019, eq. 4-7) by explicit loops over pairs and triplets; distances divided
    by the mean positive distance, Huber (smooth L1) on both, the teacher detached."""
    teacher = teacher_embeddings.detach()
    b = len(student_embeddings)

    def distances(e):
        d = [[(e[i] - e[j]).norm() for j in range(b)] for i in range(b)]
        positive = [x for row in d for x in row if x > 0]
        mean = sum(positive) / len(positive)
        return [[x / mean for x in row] for row in d]

    def unit(v):
        n = v.norm()
        return v / n if n > 0 else v * 0

    def angle(e, i, j, k):
        return (unit(e[j] - e[i]) * unit(e[k] - e[i])).sum()

    d_s, d_t = distances(student_embeddings), distances(teacher)
    dist = sum(_smooth_l1(d_s[i][j], d_t[i][j]) for i in range(b) for j in range(b)) / b**2
    ang = sum(_smooth_l1(angle(student_embeddings, i, j, k), angle(teacher, i, j, k))
              for i in range(b) for j in range(b) for k in range(b)) / b**3
    return distance_weight * dist + angle_weight * ang


def tuplet(anchor, positive, negatives, temperature) -> float:
    """−log exp(a·p/τ) / (exp(a·p/τ) + Σ_k exp(a·n_k/τ)) for one anchor of unit vectors, in plain floats."""
    def unit(v):
        n = math.sqrt(sum(x * x for x in v))
        return [x / n for x in v]

    def dot(u, v):
        return sum(x * y for x, y in zip(unit(u), unit(v))) / temperature

    pos = math.exp(dot(anchor, positive))
    return -math.log(pos / (pos + sum(math.exp(dot(anchor, n)) for n in negatives)))
