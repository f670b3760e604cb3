r"""Teacher-student geometry: how far a student's collapse geometry is the teacher's, from one pass of both
models over the same data (``PairedFeatures``) and the two models' ``FeatureStatistics``.

- **Class means after orthogonal Procrustes.** With :math:`\tilde M_s` (K x d_s) and :math:`\tilde M_t` (K x d_t)
  the class means less their mean, the best semi-orthogonal Q (Q^T Q = I or Q Q^T = I) maximises
  :math:`\mathrm{tr}(Q^\top \tilde M_s^\top \tilde M_t) = \lVert \tilde M_s^\top \tilde M_t\rVert_*` (Schonemann
  1966). ``procrustes_alignment`` :math:`= \lVert \tilde M_s^\top\tilde M_t\rVert_* / (\lVert\tilde M_s\rVert_F
  \lVert\tilde M_t\rVert_F)` in [0, 1], 1 exactly when the teacher's means are a rotated, scaled copy of the
  student's (the scale-free fit: :math:`\min_{c, Q}\lVert c\tilde M_s Q - \tilde M_t\rVert^2/\lVert\tilde M_t
  \rVert^2 = 1 - \text{alignment}^2`); ``procrustes_residual`` :math:`= \min_Q \lVert\tilde M_s Q - \tilde M_t
  \rVert_F^2 / \lVert\tilde M_t\rVert_F^2`, rotation only (scale counts).
- **Simplexes.** The K x K Grams G = M~ M~^T of the two models compared in class space (their feature spaces
  differ): ``simplex_similarity`` :math:`= \langle G_s, G_t\rangle / (\lVert G_s\rVert_F\lVert G_t\rVert_F)
  = \lVert\tilde M_s^\top\tilde M_t\rVert_F^2 / (\lVert\tilde M_s^\top\tilde M_s\rVert_F\lVert\tilde M_t^\top
  \tilde M_t\rVert_F)` (the linear CKA of the class means) and ``simplex_angle``, its arccos in degrees;
  ``classifier_similarity`` / ``classifier_angle`` the same for the classifier rows W (uncentred) and
  ``classifier_procrustes_alignment`` their Procrustes alignment. All through d x d products: no K x K matrix.
- **Linear CKA of the features** (Kornblith et al. 2019): ``feature_cka`` :math:`= \lVert C_{st}\rVert_F^2 /
  (\lVert C_{ss}\rVert_F \lVert C_{tt}\rVert_F)`, C the (cross-)covariances of the paired penultimate features
  (the biased, HSIC_0 form), and ``feature_cka_unbiased``, the same ratio of Song et al. (2012)'s unbiased HSIC
  estimator (as in Nguyen et al. 2021), both from streamed sums (``PairedFeatures``).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from kdcollapse.metrics._metric import Metric

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics._collapse import class_centred, scatter
from kdcollapse.metrics._linalg import LazyRows, cross_gram, per_row

_PAIR_STATES = ("shift_s", "shift_t", "count", "sum_s", "sum_t", "moment_s", "moment_t", "cross",
                "square_weighted_s", "square_weighted_t", "self_weighted_s", "self_weighted_t",
                "product_squares", "fourth_s", "fourth_t")


class PairedFeatures(Metric):
    """Streamed sums of paired features (x_i of the student, d_s; y_i of the teacher, d_t; the same samples) for
    the linear CKA of the two, biased and unbiased, about the first batch's means (float64; the unbiased HSIC of
    linear kernels is invariant to translation, so the shift changes no value). Memory O((d_s + d_t)^2)."""

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, student_dim: int, teacher_dim: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        ds, dt, f64 = student_dim, teacher_dim, torch.float64
        shapes = {"shift_s": (ds,), "shift_t": (dt,), "count": (), "sum_s": (ds,), "sum_t": (dt,),
                  "moment_s": (ds, ds), "moment_t": (dt, dt), "cross": (ds, dt), "square_weighted_s": (ds,),
                  "square_weighted_t": (dt,), "self_weighted_s": (ds,), "self_weighted_t": (dt,),
                  "product_squares": (), "fourth_s": (), "fourth_t": ()}
        for name in _PAIR_STATES:
            reduce = None if name.startswith("shift") else "sum"
            self.add_state(name, torch.zeros(shapes[name], dtype=f64), dist_reduce_fx=reduce)

    def update(self, student: Tensor, teacher: Tensor) -> None:
        if student.ndim != 2 or teacher.ndim != 2 or student.shape[0] != teacher.shape[0]:
            raise KdcollapseError(f"paired features must be (B, d_s) and (B, d_t) with the same B, got "
                                  f"{tuple(student.shape)} and {tuple(teacher.shape)}")
        x, y = student.detach().to(torch.float64), teacher.detach().to(self.cross.device, torch.float64)
        x = x.to(self.cross.device)
        if float(self.count) == 0:
            self.shift_s, self.shift_t = x.mean(0), y.mean(0)
        x, y = x - self.shift_s, y - self.shift_t
        sx, sy = x.square().sum(1), y.square().sum(1)
        self.count += x.shape[0]
        self.sum_s += x.sum(0)
        self.sum_t += y.sum(0)
        self.moment_s += x.mT @ x
        self.moment_t += y.mT @ y
        self.cross += x.mT @ y
        self.square_weighted_s += sy @ x  # sum |y_i|^2 x_i
        self.square_weighted_t += sx @ y  # sum |x_i|^2 y_i
        self.self_weighted_s += sx @ x
        self.self_weighted_t += sy @ y
        self.product_squares += (sx * sy).sum()
        self.fourth_s += sx.square().sum()
        self.fourth_t += sy.square().sum()

    def compute(self) -> dict[str, Tensor]:
        n = float(self.count)
        if n < 4:
            raise KdcollapseError(f"linear CKA needs at least 4 paired samples, got {int(n)}")
        centred = {name: m - torch.outer(a, b) / n for name, (m, a, b) in {
            "ss": (self.moment_s, self.sum_s, self.sum_s), "tt": (self.moment_t, self.sum_t, self.sum_t),
            "st": (self.cross, self.sum_s, self.sum_t)}.items()}
        norms = {k: v.square().sum() for k, v in centred.items()}
        biased = norms["st"] / (norms["ss"] * norms["tt"]).sqrt()

        def hsic(gram_norm, diagonal, total_a, total_b, trace_a, trace_b, middle):
            # Song et al. 2012: [tr(K~L~) + 1'K~1 1'L~1 / ((n-1)(n-2)) - 2/(n-2) 1'K~L~1] / (n(n-3))
            return (gram_norm - diagonal + (total_a - trace_a) * (total_b - trace_b) / ((n - 1) * (n - 2))
                    - 2 / (n - 2) * middle) / (n * (n - 3))

        sx, sy = self.sum_s, self.sum_t
        tr_x, tr_y = self.moment_s.trace(), self.moment_t.trace()
        cross = hsic(self.cross.square().sum(), self.product_squares, sx @ sx, sy @ sy, tr_x, tr_y,
                     sx @ self.cross @ sy - self.square_weighted_t @ sy - self.square_weighted_s @ sx
                     + self.product_squares)
        own_s = hsic(self.moment_s.square().sum(), self.fourth_s, sx @ sx, sx @ sx, tr_x, tr_x,
                     sx @ self.moment_s @ sx - 2 * self.self_weighted_s @ sx + self.fourth_s)
        own_t = hsic(self.moment_t.square().sum(), self.fourth_t, sy @ sy, sy @ sy, tr_y, tr_y,
                     sy @ self.moment_t @ sy - 2 * self.self_weighted_t @ sy + self.fourth_t)
        return {"feature_cka": biased, "feature_cka_unbiased": cross / (own_s * own_t).sqrt()}


def _frobenius(rows: LazyRows | Tensor) -> Tensor:
    return per_row(rows, lambda chunk: chunk.square().sum(1, dtype=torch.float64)).sum().sqrt()


def _compare(a, b) -> dict[str, Tensor]:
    """Procrustes alignment, residual and Gram similarity of two K-row matrices (any widths), via d x d products."""
    product = cross_gram(a, b)  # A^T B
    nuclear = torch.linalg.svdvals(product).sum()
    norm_a, norm_b = _frobenius(a), _frobenius(b)
    similarity = product.square().sum() / (cross_gram(a).square().sum() * cross_gram(b).square().sum()).sqrt()
    return {"alignment": nuclear / (norm_a * norm_b),
            "residual": (norm_a.square() + norm_b.square() - 2 * nuclear) / norm_b.square(),
            "similarity": similarity.clamp(max=1.0)}


def _degrees(cosine: Tensor) -> Tensor:
    return torch.rad2deg(torch.arccos(cosine.clamp(-1.0, 1.0)))


def geometry_alignment(student, teacher, student_weight: Tensor | None = None,
                       teacher_weight: Tensor | None = None, paired: PairedFeatures | None = None) -> dict[str, Tensor]:
    """The student's geometry against the teacher's (module docstring): two ``FeatureStatistics`` of the same
    K classes (any feature widths), optionally the two classifiers W (K x d_s, K x d_t) and the
    ``PairedFeatures`` of one pass of both over the same samples."""
    if student.num_classes != teacher.num_classes:
        raise KdcollapseError(f"the student has {student.num_classes} classes, the teacher {teacher.num_classes}")
    means_s, means_t = (class_centred(scatter(s, unit=False)) for s in (student, teacher))
    means = _compare(means_s, means_t)
    out = {"procrustes_alignment": means["alignment"], "procrustes_residual": means["residual"],
           "simplex_similarity": means["similarity"], "simplex_angle": _degrees(means["similarity"])}
    if (student_weight is None) != (teacher_weight is None):
        raise KdcollapseError("give both classifiers or neither")
    if student_weight is not None:
        rows = _compare(student_weight.detach().double(), teacher_weight.detach().double())
        out |= {"classifier_procrustes_alignment": rows["alignment"], "classifier_similarity": rows["similarity"],
                "classifier_angle": _degrees(rows["similarity"])}
    if paired is not None:
        out |= paired.compute()
    return out


__all__ = ["PairedFeatures", "geometry_alignment"]
