r"""What the logits say: per-sample margins, and the class-by-class logit matrix of DHKD App. H.

The "correlation matrix" of a classifier's logits in DHKD App. H (and in the DKD and CRD figures it
follows) is the ``K x K`` matrix of mean logits per true class, :math:`M_{kj} = \mathrm{mean}_{i: y_i = k}
z_{ij}`: how strongly inputs of class k drive logit j. The figure shows :math:`|M^t - M^s|` with the
diagonal set to zero. Since M is linear in the logits, :math:`M^t - M^s` is the same matrix of the
per-sample differences :math:`z^t_i - z^s_i`, which is what :class:`ClassLogitMatrix` accumulates.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import Metric, margin


logit_margins = margin  # z_y − max_{j≠y} z_j per row; see kdcollapse.metrics.margin


class ClassLogitMatrix(Metric):
    r"""Mean logit vector per true class, :math:`M_{kj} = \frac{1}{n_k}\sum_{i: y_i = k} z_{ij}` (``(K, K)``).

    Fed with teacher-minus-student logits :math:`z^t - z^s` it gives :math:`M^t - M^s`, the difference of
    the two logit "correlation matrices" of DHKD App. H (Fig. 6). Streaming, float64, summed across
    processes; every class needs a sample by ``compute()``.

    >>> m = ClassLogitMatrix(num_classes=2)
    >>> m.update(torch.tensor([[2.0, 0.0], [4.0, 1.0], [0.0, 3.0]]), torch.tensor([0, 0, 1]))
    >>> m.compute().tolist()
    [[3.0, 0.5], [0.0, 3.0]]
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    sums: Tensor
    counts: Tensor

    def __init__(self, num_classes: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if not isinstance(num_classes, int) or num_classes < 2:
            raise KdcollapseError(f"num_classes must be an int >= 2, got {num_classes!r}")
        self.num_classes = num_classes
        self.add_state("sums", torch.zeros(num_classes, num_classes, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("counts", torch.zeros(num_classes, dtype=torch.int64), dist_reduce_fx="sum")

    def update(self, logits: Tensor, labels: Tensor) -> None:
        """Add a batch of ``(B, K)`` logits (or logit differences) with their ``(B,)`` labels."""
        k = self.num_classes
        if logits.ndim != 2 or logits.shape[1] != k or labels.shape != (logits.shape[0],):
            raise KdcollapseError(
                f"need (B, {k}) logits and (B,) labels, got {tuple(logits.shape)} and {tuple(labels.shape)}"
            )
        self.sums.index_add_(0, labels, logits.detach().to(torch.float64))
        self.counts += torch.bincount(labels, minlength=k)

    def compute(self) -> Tensor:
        empty = (self.counts == 0).nonzero().flatten().tolist()
        if empty:
            raise KdcollapseError(f"classes {empty[:10]} have no samples; the class logit matrix needs every class")
        return self.sums / self.counts[:, None]


def logit_matrix_difference(
    teacher_logits: Tensor, student_logits: Tensor, labels: Tensor, num_classes: int
) -> Tensor:
    """:math:`M^t - M^s` (``(K, K)``) of DHKD App. H for logits held in memory; see :class:`ClassLogitMatrix`."""
    if teacher_logits.shape != student_logits.shape:
        shapes = f"{tuple(teacher_logits.shape)} and {tuple(student_logits.shape)}"
        raise KdcollapseError(f"teacher and student logits differ in shape: {shapes}")
    metric = ClassLogitMatrix(num_classes, sync_on_compute=False).to(teacher_logits.device)
    metric.update(teacher_logits.double() - student_logits.double(), labels)
    return metric.compute()


def off_diagonal_mean_abs(matrix: Tensor) -> float:
    """Mean of ``|matrix|`` off the diagonal: the one-number summary of a DHKD App. H figure."""
    k = matrix.shape[0]
    mask = ~torch.eye(k, dtype=torch.bool, device=matrix.device)
    return float(matrix.abs()[mask].mean())
