"""Per-sample objectives the attacks maximise (or, for the margin, minimise)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import margin  # the Square attack's loss and the DLR numerator

_DLR_EPS = 1e-12  # keeps the DLR denominator positive when the top logits tie


_DLR_DENOMINATOR = {3: "z_π1 − z_π3", 4: "z_π1 − (z_π3 + z_π4)/2"}


def require_classes(n_classes: int, needed: int, what: str) -> None:
    """The DLR losses need 3 (untargeted) or 4 (targeted) classes: raise a clear error otherwise."""
    if n_classes < needed:
        raise KdcollapseError(f"{what} needs at least {needed} classes (the DLR loss divides by "
                              f"{_DLR_DENOMINATOR[needed]}); got {n_classes}")


def dlr_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Difference of Logits Ratio (Croce & Hein, ICML 2020), per sample (B,):

    .. math:: \\mathrm{DLR}(z, y) = -\\frac{z_y - \\max_{i \\ne y} z_i}{z_{\\pi_1} - z_{\\pi_3}}

    with π the classes sorted by decreasing logit. Invariant to shifting and (positively) scaling the
    logits. Needs at least 3 classes.
    """
    require_classes(logits.shape[-1], 3, "the DLR loss")
    top = logits.topk(3, dim=1).values
    return -margin(logits, y) / (top[:, 0] - top[:, 2] + _DLR_EPS)


def dlr_targeted_loss(logits: Tensor, y: Tensor, target: Tensor) -> Tensor:
    """Targeted DLR (Croce & Hein, ICML 2020), per sample (B,), maximised by APGD-T:

    .. math:: \\mathrm{DLR}_t(z, y) = -\\frac{z_y - z_t}{z_{\\pi_1} - (z_{\\pi_3} + z_{\\pi_4})/2}

    Needs at least 4 classes.
    """
    require_classes(logits.shape[-1], 4, "the targeted DLR loss")
    top = logits.topk(4, dim=1).values
    z_y = logits.gather(1, y[:, None]).squeeze(1)
    z_t = logits.gather(1, target[:, None]).squeeze(1)
    return -(z_y - z_t) / (top[:, 0] - 0.5 * (top[:, 2] + top[:, 3]) + _DLR_EPS)


def cross_entropy(logits: Tensor, y: Tensor) -> Tensor:
    return F.cross_entropy(logits, y, reduction="none")


def kl_from_natural(logits: Tensor, log_p_natural: Tensor) -> Tensor:
    """KL(P_nat ‖ P_adv) per sample (B,), the inner maximisation of TRADES (Zhang et al., ICML 2019),
    from the adversarial logits and the natural log-probabilities."""
    return (log_p_natural.exp() * (log_p_natural - torch.log_softmax(logits, dim=1))).sum(1)
