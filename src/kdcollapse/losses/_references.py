"""Slow, obviously-correct references for the declared losses, written from the papers' definitions: loops
over samples (and pairs, classes), no vectorised trick, no shared helper with the fast code. A declaration
names its reference (``register_loss(..., reference=...)``); the registry-driven contract test
(tests/test_loss_references.py) compares value and the fitted side's gradient in float64 on random inputs.
Each takes the loss's own arguments (what the declaration's ``example`` and ``variants`` pass), with its
defaults. The token divergences' references are in :mod:`kdcollapse.losses._token_references`.
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
    """mean_b [−T_y·log S_y − γ·τ²·Σ_{j≠y} T̂_j log Ŝ_j] (NKD paper eq. 8): T_y the teacher's target
    probability (no gradient), T̂ and Ŝ the softmax over the K − 1 non-target logits at τ."""
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


def _softmax_rows(z: Tensor, temperature: float = 1.0) -> list[Tensor]:
    return [torch.softmax(row / temperature, 0) for row in z]


def _pairwise_sq(diff: Tensor, w: Tensor) -> Tensor:
    """¼·Σ_jk w_j w_k (diff_j − diff_k)², by a double loop."""
    k = len(diff)
    return 0.25 * sum(w[a] * w[b] * (diff[a] - diff[b]) ** 2 for a in range(k) for b in range(k))


def dkl(logits_m: Tensor, logits_n: Tensor, alpha: float = 1.0, beta: float = 1.0) -> Tensor:
    """mean_b [α·¼·Σ_jk S(s_m^j s_m^k)·(Δm_jk − S(Δn_jk))² − β·Σ_j S(s_m^j) log s_n^j], s = softmax, S =
    stop-gradient (DKL paper eq. 5)."""
    terms = []
    for m, n in zip(logits_m, logits_n):
        s_m = torch.softmax(m, 0).detach()
        terms.append(alpha * _pairwise_sq(m - n.detach(), s_m) - beta * (s_m * torch.log_softmax(n, 0)).sum())
    return _mean(terms)


def ikl(student: Tensor, teacher: Tensor, *, class_weights: Tensor | None = None, target: Tensor | None = None,
        mse_weight: float = 1.0, ce_weight: float = 1.0, temperature: float = 1.0) -> Tensor:
    """mean_b [mse_weight·¼·Σ_jk w_j w_k ((t_j − t_k) − (s_j − s_k))² − ce_weight·Σ_j S(softmax(t/τ))_j
    log softmax(s/τ)_j], w = class_weights[y] or S(softmax(t)) (DKL paper eq. 10)."""
    terms = []
    for b, (s, t) in enumerate(zip(student, teacher)):
        w = torch.softmax(t, 0).detach() if class_weights is None else class_weights[int(target[b])].detach()
        soft = torch.softmax(t / temperature, 0).detach()
        terms.append(mse_weight * _pairwise_sq(t - s, w)
                     - ce_weight * (soft * torch.log_softmax(s / temperature, 0)).sum())
    return _mean(terms)


def ikl_at(natural: Tensor, adversarial: Tensor, target: Tensor, class_weights: Tensor | None,
           mse_weight: float = 20.0, ce_weight: float = 4.0) -> Tensor:
    """CE(natural, y) + IKL with the natural logits as the teacher side and the adversarial as the student
    side, τ = 1 (DKL paper §4.1)."""
    ce = _mean(-torch.log_softmax(z, 0)[y] for z, y in zip(natural, target.tolist()))
    return ce + ikl(adversarial, natural, class_weights=class_weights, target=target, mse_weight=mse_weight,
                    ce_weight=ce_weight)


def class_correlation(student: Tensor, teacher: Tensor, temperature: float = 4.0) -> Tensor:
    """(1/K)·Σ_jk (G_t − G_s)²_jk, G_jk = Σ_b P_bj P_bk, P = softmax(Z/τ) per row (MLKD eq. 6)."""
    p_s, p_t = torch.stack(_softmax_rows(student, temperature)), torch.stack(_softmax_rows(teacher, temperature))
    k = p_s.shape[1]
    return sum((torch.dot(p_t[:, a], p_t[:, c]) - torch.dot(p_s[:, a], p_s[:, c])) ** 2
               for a in range(k) for c in range(k)) / k


def batch_correlation(student: Tensor, teacher: Tensor, temperature: float = 4.0) -> Tensor:
    """(1/B)·Σ_ij (G_t − G_s)²_ij, G_ij = Σ_k P_ik P_jk, P = softmax(Z/τ) per row (MLKD eq. 5)."""
    p_s, p_t = _softmax_rows(student, temperature), _softmax_rows(teacher, temperature)
    b = len(p_s)
    return sum((torch.dot(p_t[i], p_t[j]) - torch.dot(p_s[i], p_s[j])) ** 2 for i in range(b) for j in range(b)) / b


def _pearson(a: Tensor, b: Tensor, eps: float = 1e-8) -> Tensor:
    a, b = a - a.mean(), b - b.mean()
    return (a * b).sum() / (a.norm() * b.norm() + eps)


def dist(student: Tensor, teacher: Tensor, beta: float = 1.0, gamma: float = 1.0, temperature: float = 1.0) -> Tensor:
    """τ²·[β·(1 − mean_i ρ(Y_s[i], Y_t[i])) + γ·(1 − mean_j ρ(Y_s[:, j], Y_t[:, j]))], Y = softmax(z/τ) per
    row, ρ the Pearson correlation with the official ε = 1e-8 (DIST eqs. 4-7, the official τ²)."""
    y_s, y_t = torch.stack(_softmax_rows(student, temperature)), torch.stack(_softmax_rows(teacher, temperature))
    inter = 1 - _mean(_pearson(a, b) for a, b in zip(y_s, y_t))
    intra = 1 - _mean(_pearson(a, b) for a, b in zip(y_s.T, y_t.T))
    return temperature**2 * (beta * inter + gamma * intra)


def _average_pool(a: Tensor, size: int) -> Tensor:
    """(C, H, W) → (C, size, size) by the mean of each (H/size)×(W/size) block (H, W multiples of size)."""
    c, h, w = a.shape
    bh, bw = h // size, w // size
    return torch.stack([torch.stack([torch.stack([a[k, i * bh:(i + 1) * bh, j * bw:(j + 1) * bw].mean()
                                                  for j in range(size)]) for i in range(size)]) for k in range(c)])


def _pooled_pair(s: Tensor, t: Tensor) -> tuple[Tensor, Tensor]:
    size = min(s.shape[-1], t.shape[-1])
    return _average_pool(s, size), _average_pool(t, size)


def at(student_maps: Tensor, teacher_maps: Tensor, p: float = 2.0) -> Tensor:
    """mean_{b,j} (Q_s[b, j] − Q_t[b, j])², Q the unit vector of the channel means of |A|^p at each position,
    the larger map average-pooled to the smaller (AT paper eqs. 1-2, the authors' mean)."""
    terms = []
    for s, t in zip(student_maps, teacher_maps.detach()):
        s, t = _pooled_pair(s, t)
        q_s, q_t = (a.abs().pow(p).mean(0).flatten() for a in (s, t))
        terms.extend(((q_s / q_s.norm()) - (q_t / q_t.norm())) ** 2)
    return torch.stack(terms).mean()


def nst(student_maps: Tensor, teacher_maps: Tensor) -> Tensor:
    """mean_b MMD² of the unit channel vectors with k(x, y) = (xᵀy)²: mean k(T, T') + mean k(S, S') −
    2·mean k(S, T) over channel pairs, the larger map average-pooled to the smaller (NST eqs. 4-6)."""
    def kernel_mean(u, v):
        return torch.stack([torch.dot(a, b) ** 2 for a in u for b in v]).mean()

    terms = []
    for s, t in zip(student_maps, teacher_maps.detach()):
        s, t = _pooled_pair(s, t)
        f_s = [c.flatten() / c.flatten().norm() for c in s]
        f_t = [c.flatten() / c.flatten().norm() for c in t]
        terms.append(kernel_mean(f_t, f_t) + kernel_mean(f_s, f_s) - 2 * kernel_mean(f_s, f_t))
    return _mean(terms)


def vid(predicted_mean: Tensor, teacher: Tensor, log_scale: Tensor, eps: float = 1e-5) -> Tensor:
    """The mean over entries of ½[(μ − t)²/σ_c² + log σ_c²], σ_c² = log(1 + e^{α_c}) + ε (VID §3)."""
    terms = []
    for mu_b, t_b in zip(predicted_mean, teacher):
        for c, (mu, t) in enumerate(zip(mu_b, t_b)):
            variance = torch.log1p(torch.exp(log_scale[c])) + eps
            terms.extend((0.5 * ((mu - t) ** 2 / variance + torch.log(variance))).flatten())
    return torch.stack(terms).mean()


def crd_nce(log_scores: Tensor, num_data: int, normalizer: float | None = None) -> Tensor:
    """−(1/B) Σ_b [log P_0/(P_0 + K/N + ε) + Σ_{i≥1} log (K/N)/(P_i + K/N + ε)], P_i = e^{s_i}/Z,
    Z = N·mean e^s of the batch unless given, ε = 1e-7 (CRD's NCE with noise 1/N, the official code)."""
    n, k = int(num_data), log_scores.shape[1] - 1
    if normalizer is None:
        normalizer = float(log_scores.detach().exp().mean()) * n
    noise = k / n
    total = 0
    for row in log_scores:
        p = row.exp() / normalizer
        total = total + torch.log(p[0] / (p[0] + noise + 1e-7)) + sum(torch.log(noise / (p_i + noise + 1e-7))
                                                                    for p_i in p[1:])
    return -total / len(log_scores)


def crd(anchors: Tensor, memory_rows: Tensor, num_data: int, normalizer: float | None = None,
        temperature: float = 0.07) -> Tensor:
    """:func:`crd_nce` on the scores s_i = m_i·v/τ of each anchor v against its drawn memory rows m_i."""
    scores = torch.stack([torch.stack([torch.dot(m, v) / temperature for m in rows])
                          for v, rows in zip(anchors, memory_rows)])
    return crd_nce(scores, num_data, normalizer)


def intra_class_contrastive(anchors: Tensor, positives: Tensor, negatives: Tensor,
                            negative_mask: Tensor | None = None, temperature: float = 1.0, *,
                            normalize: bool = True) -> Tensor:
    """mean_b −log e^{a·p/τ} / (e^{a·p/τ} + Σ_{valid k} e^{a·n_k/τ}), on unit vectors unless ``normalize``
    is false (the (n+1)-tuplet loss, L_Intra of the intra-class KD paper eq. 4)."""
    def unit(v):
        return v / v.norm() if normalize else v

    terms = []
    for b, (a, p) in enumerate(zip(anchors, positives)):
        positive = torch.exp(torch.dot(unit(a), unit(p)) / temperature)
        kept = [n for k, n in enumerate(negatives[b]) if negative_mask is None or bool(negative_mask[b, k])]
        others = sum(torch.exp(torch.dot(unit(a), unit(n)) / temperature) for n in kept)
        terms.append(-torch.log(positive / (positive + others)))
    return _mean(terms)


def hcl(student: Tensor, teacher: Tensor, levels=(4, 2, 1)) -> Tensor:
    """[MSE + Σ_i 2^−i·MSE(pool_i)] / (1 + Σ_i 2^−i) over the pooling sizes below the map's side, pool_i the
    block means to l_i×l_i (ReviewKD's hierarchical context loss, §3.3)."""
    def mse(a, b):
        return torch.stack([((x - y) ** 2) for x, y in zip(a.flatten(), b.flatten())]).mean()

    loss, weight, total = mse(student, teacher), 1.0, 1.0
    for size in levels:
        if size >= student.shape[2]:
            continue
        weight /= 2.0
        pooled = [torch.stack([_average_pool(a, size) for a in x]) for x in (student, teacher)]
        loss, total = loss + weight * mse(*pooled), total + weight
    return loss / total


def ofd(student_maps: Tensor, teacher_maps: Tensor, margins: Tensor) -> Tensor:
    """One stage of OFD: (1/B) Σ_{b,c,h,w} d_p(max(T, m_c), S), d_p(t, s) = 0 where s ≤ t ≤ 0 and (t − s)²
    elsewhere, the teacher's map average-pooled to the student's size (OFD eqs. 3-5)."""
    total = 0
    for s, t in zip(student_maps, teacher_maps.detach()):
        t = _average_pool(t, s.shape[-1])
        for c in range(len(s)):
            for x, target in zip(s[c].flatten(), torch.clamp(t[c].flatten(), min=float(margins[c].detach()))):
                total = total + (0 * x if x <= target <= 0 else (target - x) ** 2)
    return total / len(student_maps)


def srd(student_projected: Tensor, teacher_normalized: Tensor, exponent: float = 4.0) -> Tensor:
    """log Σ over samples and features of |p − q|^α (torchdistill's SRDLoss feature term)."""
    terms = [(a - b).abs() ** exponent for row_p, row_q in zip(student_projected, teacher_normalized)
             for a, b in zip(row_p, row_q)]
    return torch.stack(terms).sum().log()


def akl(student: Tensor, teacher: Tensor, mu: float = 0.5, temperature: float = 1.0) -> Tensor:
    """Mean over rows of w_head·KL(p ‖ q) + w_tail·KL(q ‖ p) (AKL, Wu et al. 2025, Sec. 4): the head is the teacher's
    most probable tokens while their running mass stays ≤ μ (the first always), w = g / (g_head + g_tail) with
    g the summed |p_v − q_v| over each part, the student's side of the gaps held constant (the authors' code)."""
    values = []
    for s, t in zip(student, teacher):
        p, q = torch.softmax(t / temperature, 0), torch.softmax(s / temperature, 0)
        order = sorted(range(len(p)), key=lambda v: (-float(p[v]), v))
        head, mass = set(), 0.0
        for rank, v in enumerate(order):
            mass += float(p[v])
            if rank == 0 or mass <= mu:
                head.add(v)
            else:
                break
        fixed = q.detach()
        g_head = sum(abs(float(p[v]) - float(fixed[v])) for v in head)
        g_tail = sum(abs(float(p[v]) - float(fixed[v])) for v in range(len(p)) if v not in head)
        w_head, w_tail = (g_head / (g_head + g_tail), g_tail / (g_head + g_tail)) if g_head + g_tail > 0 else (0.5, 0.5)
        values.append(w_head * _kl(p, q) + w_tail * _kl(q, p))
    return _mean(values)
