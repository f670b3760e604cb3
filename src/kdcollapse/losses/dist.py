"""DIST: knowledge distillation from a stronger teacher (Huang et al., NeurIPS 2022).

DIST replaces KD's exact match of probabilities by a match of their *relations*: the Pearson
correlation between student and teacher probabilities, once across the classes of each sample
(inter-class relation, eq. 5) and once across the samples of the batch for each class (intra-class
relation, eq. 6). A correlation is invariant to a positive affine map of either side, so the student
need not reproduce the teacher's scale or shift of probabilities, only their ranking and shape.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.losses import _references
from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses._reduce import logit_samples
from kdcollapse.losses._shapes import check_positive, check_tensor

_EPS = 1e-8  # the official cosine's denominator guard, kept so values match the official code


def pearson_correlation(a: Tensor, b: Tensor, eps: float = _EPS) -> Tensor:
    """Row-wise Pearson correlation of (N, M) tensors, (N,): the cosine of the centred rows.

    ρ(a, b) = ⟨a − ā, b − b̄⟩ / (‖a − ā‖·‖b − b̄‖ + eps) (DIST eq. 4; ``eps`` as in the official code).
    """
    a = a - a.mean(-1, keepdim=True)
    b = b - b.mean(-1, keepdim=True)
    return (a * b).sum(-1) / (a.norm(dim=-1) * b.norm(dim=-1) + eps)


@register_loss("dist", kind="logits", paper="Huang et al. 2022, Knowledge distillation from a stronger teacher (NeurIPS)",
               equation="τ²·[β·(1 − mean_i ρ(Y_s,i:, Y_t,i:)) + γ·(1 − mean_j ρ(Y_s,:j, Y_t,:j))] (eqs. 5-7)",
               temperature=True, sequences=False, ignore_index=False, chunked=False,
               example=lambda k, y: {"temperature": 4.0, "gamma": 2.0},
               reference=_references.dist)
def dist_loss(student: Tensor, teacher: Tensor, beta: float = 1.0, gamma: float = 1.0,
              temperature: float = 1.0, *, validate: bool | None = None) -> Tensor:
    """τ²·[β·(1 − mean_i ρ(Y_s[i, :], Y_t[i, :])) + γ·(1 − mean_j ρ(Y_s[:, j], Y_t[:, j]))] (DIST eq. 7).

    Y = softmax(z/τ) row by row, for the B samples (rows) and K classes (columns) of the batch;
    ρ is :func:`pearson_correlation`. The first term is the inter-class relation (eq. 5: each
    sample's K probabilities), the second the intra-class relation (eq. 6: each class's B
    probabilities across the batch). The τ² factor is the official code's (``DIST(tau=...)``);
    the paper's eq. 7 has none, and with the official ImageNet τ = 1 the two agree.
    Gradients flow into both arguments as in the formula; a frozen teacher simply has none. Logits
    are (B, K): the intra-class term couples the samples of the batch, so there is no per-sample
    value, no reduction other than this mean and no (B, T, K) form with masks. Half inputs accumulate
    in float32. With B = 1 the intra-class correlation is 0/eps = 0 for every class.
    """
    check_positive("temperature", temperature)
    check_tensor("student", student, (2,))
    check_tensor("teacher", teacher, (2,))
    samples = logit_samples({"student": student, "teacher": teacher}, validate=validate)
    s, t = (x.to(samples.dtype) for x in samples.logits)
    y_s = torch.softmax(s / temperature, dim=-1)
    y_t = torch.softmax(t / temperature, dim=-1)
    inter = 1 - pearson_correlation(y_s, y_t).mean()
    intra = 1 - pearson_correlation(y_s.T, y_t.T).mean()
    return temperature**2 * (beta * inter + gamma * intra)
