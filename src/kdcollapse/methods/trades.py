"""TRADES adversarial training (Zhang et al., ICML 2019), with the options of the improved baseline of
the DKL paper §4.1 (ε ramp, AWP, weight average; see :mod:`kdcollapse.methods._adversarial`)."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from kdcollapse.losses import trades_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._adversarial import AdversarialConfig, AdversarialTraining
from kdcollapse.methods._distill import loss


def equals(m, x, y):
    """trades(z(x), z(x'), y, β), x' the method's attack (its connector)."""
    x_adv = m.adversarial_inputs(x)
    return loss("trades")(m.student(x), m.student(x_adv), y, m.config.beta)


@register_method("trades", equals=equals)
class TRADES(AdversarialTraining):
    """Minimise CE(f(x), y) + β·KL(P(x) ‖ P(x')) with x' the TRADES inner maximiser of the same KL
    (Zhang et al. 2019, eq. 5); no gradient is stopped (official code)."""

    @dataclass
    class Config(AdversarialConfig):
        beta: float = 6.0  # weight β of the KL term (1/λ in the paper)

    def training_loss(self, logits_natural: Tensor, logits_adversarial: Tensor, target: Tensor) -> Tensor:
        return trades_loss(logits_natural, logits_adversarial, target, beta=self.config.beta)
