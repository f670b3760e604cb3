"""Transfer-learning summary used with the VCI paper's experiments."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError


def mean_log_odds_gain(downstream_accs: Sequence[float] | Tensor, pretrain_acc: float | Tensor) -> float:
    r"""Mean log-odds gain (VCI paper eq. 6), accuracies as fractions in (0, 1):

    .. math::
        \mathrm{MLOG} = \frac1n\sum_{i=1}^n \log\frac{p_i}{1-p_i} - \log\frac{p_{pretrain}}{1-p_{pretrain}}

    The paper's tau = 0.1 run (its Tables 1 and 2 report MLOG 0.3250 from these rounded accuracies):

    >>> accs = [0.908, 0.9503, 0.5885, 0.6473, 0.7447, 0.931, 0.7545, 0.7714, 0.849, 0.6244]
    >>> round(mean_log_odds_gain(accs, pretrain_acc=0.754), 4)
    0.3251
    """
    p = torch.as_tensor(downstream_accs, dtype=torch.float64).flatten()
    q = torch.as_tensor(pretrain_acc, dtype=torch.float64)
    if p.numel() == 0:
        raise KdcollapseError("mean_log_odds_gain needs at least one downstream accuracy")
    if q.numel() != 1:
        raise KdcollapseError(f"pretrain_acc must be one number, got {q.numel()} values")
    values = torch.cat([p, q.flatten()])
    if not bool(((values > 0) & (values < 1)).all()):
        raise KdcollapseError(
            f"accuracies must be fractions in (0, 1), got {values.tolist()}; divide percentages by 100"
        )
    return float(torch.logit(p).mean() - torch.logit(q))
