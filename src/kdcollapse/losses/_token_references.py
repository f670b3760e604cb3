"""Slow, obviously-correct references for the token divergences of LLM distillation (the continuation of
:mod:`kdcollapse.losses._references`, kept apart for its size), written from the papers' definitions: a loop
over rows and vocabulary entries on explicit probabilities p (teacher) and q (student), softmax(z / τ), no
log-space mixture, no shared helper with the fast code (``losses/llm.py``, ``abkd.py``, ``distillm2.py``,
``fused.py``). Each takes its loss's own arguments with the same defaults; the declarations name them
(``register_loss(..., reference=...)``) and tests/test_loss_references.py compares value and the student's
gradient in float64. No τ² factor, as the losses.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _probabilities(z: Tensor, temperature: float) -> Tensor:
    e = torch.exp(z / temperature)
    return e / e.sum()


def _kl(a: Tensor, c: Tensor) -> Tensor:
    """KL(a ‖ c) = Σ_v a_v log(a_v / c_v), entry by entry."""
    return sum(a[v] * torch.log(a[v] / c[v]) for v in range(len(a)))


def _mean_rows(student: Tensor, teacher: Tensor, temperature: float, row) -> Tensor:
    """Mean over the rows of (B, K) logits of ``row(p, q)``."""
    values = [row(_probabilities(t, temperature), _probabilities(s, temperature)) for s, t in zip(student, teacher)]
    return torch.stack(values).mean()


# --- per-row definitions, p the teacher's and q the student's distribution --------------------------------

def _row_jsd(p: Tensor, q: Tensor, beta: float) -> Tensor:
    """GKD eq. 1: β KL(p ‖ m) + (1 − β) KL(q ‖ m), m = β p + (1 − β) q; at the ends TRL's convention
    (generalized_jsd_loss): β = 0 is KL(p ‖ q), β = 1 is KL(q ‖ p) (the formula itself vanishes there)."""
    if beta == 0:
        return _kl(p, q)
    if beta == 1:
        return _kl(q, p)
    m = torch.stack([beta * p[v] + (1 - beta) * q[v] for v in range(len(p))])
    return beta * _kl(p, m) + (1 - beta) * _kl(q, m)


def _row_abkd(p: Tensor, q: Tensor, alpha: float, beta: float) -> Tensor:
    """The α-β divergence (Cichocki, Cruces & Amari 2011, eq. 4 and its continuations; ABKD eq. 6):
    −1/(αβ) Σ_v [p^α q^β − α/(α+β) p^(α+β) − β/(α+β) q^(α+β)], on the lines where it is 0/0 its limit."""
    terms = []
    for pv, qv in zip(p, q):
        if alpha == 0 and beta == 0:
            terms.append(0.5 * (torch.log(pv) - torch.log(qv)) ** 2)
        elif alpha == 0:
            terms.append((qv**beta * torch.log(qv**beta / pv**beta) - qv**beta + pv**beta) / beta**2)
        elif beta == 0:
            terms.append((pv**alpha * torch.log(pv**alpha / qv**alpha) - pv**alpha + qv**alpha) / alpha**2)
        elif alpha + beta == 0:
            terms.append((torch.log(qv**alpha / pv**alpha) + pv**alpha / qv**alpha - 1) / alpha**2)
        else:
            s = alpha + beta
            terms.append(-(pv**alpha * qv**beta - alpha / s * pv**s - beta / s * qv**s) / (alpha * beta))
    return sum(terms)


def _row_student_kl(p: Tensor, q: Tensor, alpha: float) -> Tensor:
    """DistiLLM-2's student-response term: KL(q ‖ (1 − α) p + α sg(q)), the student's share of the mixture
    without gradient (the official ``vocab_logps.detach()``)."""
    fixed = q.detach()
    return _kl(q, torch.stack([(1 - alpha) * p[v] + alpha * fixed[v] for v in range(len(p))]))


def _row_skew_forward(p: Tensor, q: Tensor, alpha: float) -> Tensor:
    """DistiLLM eq. 3: KL(p ‖ α p + (1 − α) q)."""
    return _kl(p, torch.stack([alpha * p[v] + (1 - alpha) * q[v] for v in range(len(p))]))


def _row_skew_reverse(p: Tensor, q: Tensor, alpha: float) -> Tensor:
    """DistiLLM eq. 4: KL(q ‖ α q + (1 − α) p)."""
    return _kl(q, torch.stack([alpha * q[v] + (1 - alpha) * p[v] for v in range(len(p))]))


ROWS = {
    "forward_kl": lambda p, q: _kl(p, q),
    "reverse_kl": lambda p, q: _kl(q, p),
    "jsd": lambda p, q, beta=0.5: _row_jsd(p, q, beta),
    "skew_forward_kl": lambda p, q, alpha=0.1: _row_skew_forward(p, q, alpha),
    "skew_reverse_kl": lambda p, q, alpha=0.1: _row_skew_reverse(p, q, alpha),
    "tvd": lambda p, q: 0.5 * sum((p[v] - q[v]).abs() for v in range(len(p))),
    "abkd": lambda p, q, alpha=0.2, beta=0.7: _row_abkd(p, q, alpha, beta),
    "distillm2_student_kl": lambda p, q, alpha=0.1: _row_student_kl(p, q, alpha),
}
"""Each token divergence's per-row definition ``f(p, q, **parameters)`` (the declared defaults)."""


# --- the losses: the mean over rows ------------------------------------------------------------------------

def forward_kl(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> Tensor:
    """Mean over rows of KL(p ‖ q) (Hinton et al. 2015; GKD Sec. 3), no τ²."""
    return _mean_rows(student, teacher, temperature, ROWS["forward_kl"])


def reverse_kl(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> Tensor:
    """Mean over rows of KL(q ‖ p) (GKD; MiniLLM), no τ²."""
    return _mean_rows(student, teacher, temperature, ROWS["reverse_kl"])


def jsd(student: Tensor, teacher: Tensor, beta: float = 0.5, temperature: float = 1.0) -> Tensor:
    """Mean over rows of GKD's generalized JSD (eq. 1, TRL's ends: β = 0 forward KL, β = 1 reverse KL)."""
    return _mean_rows(student, teacher, temperature, lambda p, q: _row_jsd(p, q, beta))


def skew_forward_kl(student: Tensor, teacher: Tensor, alpha: float = 0.1, temperature: float = 1.0) -> Tensor:
    """Mean over rows of KL(p ‖ α p + (1 − α) q) (DistiLLM eq. 3)."""
    return _mean_rows(student, teacher, temperature, lambda p, q: _row_skew_forward(p, q, alpha))


def skew_reverse_kl(student: Tensor, teacher: Tensor, alpha: float = 0.1, temperature: float = 1.0) -> Tensor:
    """Mean over rows of KL(q ‖ α q + (1 − α) p) (DistiLLM eq. 4)."""
    return _mean_rows(student, teacher, temperature, lambda p, q: _row_skew_reverse(p, q, alpha))


def tvd(student: Tensor, teacher: Tensor, temperature: float = 1.0) -> Tensor:
    """Mean over rows of the total variation ½ Σ_v |p_v − q_v|."""
    return _mean_rows(student, teacher, temperature, ROWS["tvd"])


def abkd(student: Tensor, teacher: Tensor, alpha: float = 0.2, beta: float = 0.7, temperature: float = 1.0) -> Tensor:
    """Mean over rows of ABKD's α-β divergence D_AB(p ‖ q) (Wang et al. 2025) and its limits."""
    return _mean_rows(student, teacher, temperature, lambda p, q: _row_abkd(p, q, alpha, beta))


def distillm2_student_kl(student: Tensor, teacher: Tensor, alpha: float = 0.1, temperature: float = 1.0) -> Tensor:
    """Mean over rows of KL(q ‖ (1 − α) p + α sg(q)) (DistiLLM-2, the student-response half)."""
    return _mean_rows(student, teacher, temperature, lambda p, q: _row_student_kl(p, q, alpha))


def distillm2(student: Tensor, teacher: Tensor, student_response: Tensor, alpha: float = 0.1,
              temperature: float = 1.0) -> Tensor:
    """DistiLLM-2 (Ko et al. 2025): the mean over rows of KL(p ‖ α p + (1 − α) q) where the teacher wrote the
    response and KL(q ‖ (1 − α) p + α sg(q)) where the student did (``student_response``, one flag a row)."""
    values = []
    for s, t, by_student in zip(student, teacher, student_response.tolist()):
        p, q = _probabilities(t, temperature), _probabilities(s, temperature)
        values.append(_row_student_kl(p, q, alpha) if by_student else _row_skew_forward(p, q, alpha))
    return torch.stack(values).mean()


def _teacher_logits(teacher, i: int, vocab: int) -> Tensor:
    """Row ``i`` of the teacher's logits, cut to the student's ``vocab``: its logits (``TeacherLogits``) or
    its hidden state times its head (``TeacherHead``)."""
    if hasattr(teacher, "logits"):
        return teacher.logits[i, :vocab]
    return torch.stack([torch.dot(teacher.hidden[i], teacher.weight[v]) for v in range(vocab)])


def _student_logits(hidden: Tensor, weight: Tensor, i: int) -> Tensor:
    return torch.stack([torch.dot(hidden[i], weight[v]) for v in range(len(weight))])


def fused_head(hidden: Tensor, weight: Tensor, teacher, divergence: str = "forward_kl", temperature: float = 1.0, *,
               labels: Tensor | None = None, ce_weight: float = 0.0, distill_weight: float = 1.0,
               mask: Tensor | None = None, ignore_index: int = -100, chunk_size: int = 1024,
               **parameters: float) -> Tensor:
    """The mean over kept rows i (mask set, label not ignore_index) of ce_weight·(−log softmax(z_i)[y_i]) +
    distill_weight·D(p_i ‖ q_i), z_i = (⟨h_i, W_v⟩)_v the student's logits, D the per-row definition above
    (:data:`ROWS`); the teacher as logits or hidden state and head (no stored top-k). ``chunk_size`` changes
    nothing."""
    values = []
    for i in range(len(hidden)):
        if (mask is not None and not bool(mask[i])) or (labels is not None and int(labels[i]) == ignore_index):
            continue
        z = _student_logits(hidden, weight, i)
        value = 0
        if distill_weight:
            p, q = _probabilities(_teacher_logits(teacher, i, len(weight)), temperature), _probabilities(z, temperature)
            value = distill_weight * ROWS[divergence](p, q, **parameters)
        if ce_weight:
            value = value - ce_weight * torch.log(_probabilities(z, 1.0)[int(labels[i])])
        values.append(value)
    return torch.stack(values).mean()


def distillm2_fused(hidden: Tensor, weight: Tensor, teacher, student_response: Tensor, alpha: float = 0.1,
                    temperature: float = 1.0, *, labels: Tensor | None = None, ce_weight: float = 0.0,
                    distill_weight: float = 1.0, mask: Tensor | None = None, ignore_index: int = -100,
                    chunk_size: int = 1024) -> Tensor:
    """DistiLLM-2 on the student logits z_i = (⟨h_i, W_v⟩)_v: the mean over kept rows of distill_weight·
    KL(p ‖ α p + (1 − α) q) (plus ce_weight·CE) on teacher-response rows and distill_weight·KL(q ‖ (1 − α) p +
    α sg(q)) on student-response rows."""
    values = []
    for i in range(len(hidden)):
        if (mask is not None and not bool(mask[i])) or (labels is not None and int(labels[i]) == ignore_index):
            continue
        z = _student_logits(hidden, weight, i)
        p, q = _probabilities(_teacher_logits(teacher, i, len(weight)), temperature), _probabilities(z, temperature)
        if bool(student_response[i]):
            values.append(distill_weight * _row_student_kl(p, q, alpha))
        else:
            value = distill_weight * _row_skew_forward(p, q, alpha)
            if ce_weight:
                value = value - ce_weight * torch.log(_probabilities(z, 1.0)[int(labels[i])])
            values.append(value)
    return torch.stack(values).mean()
