"""IKL-AT: adversarial training with the Improved KL divergence (DKL paper, eq. 10 and §4.1).

The KL of TRADES is replaced by IKL between the natural logits (o_m, the "teacher" side, whose
gradient is *not* stopped) and the adversarial logits (o_n), with class-wise weights w̄_y = s̄_y s̄_yᵀ
from the model's own clean probabilities at temperature T, averaged per class over the previous epoch
(:class:`ClassMeanProbabilities`; uniform in epoch 1).
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from kdcollapse.losses import ikl_at_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._adversarial import AdversarialConfig, AdversarialTraining
from kdcollapse.methods._class_means import ClassMeanProbabilities
from kdcollapse.methods._distill import loss


def equals(m, x, y):
    """ikl_at(z(x), z(x'), y, w̄) with the previous epoch's class weights w̄, x' the method's attack."""
    cfg, x_adv = m.config, m.adversarial_inputs(x)
    natural = m.student(x)
    return loss("ikl_at")(natural, m.student(x_adv), y, m.class_means.weights(natural), mse_weight=cfg.mse_weight,
                          ce_weight=cfg.ce_weight)


@register_method("ikl_at", equals=equals)
class IKLAT(AdversarialTraining):
    """Minimise CE(f(x), y) + IKL(f(x) → f(x')) (DKL paper eq. 10), x' the TRADES inner maximiser.

    ``mse_weight``/``ce_weight`` are the official code's ``--beta 20``/``--alpha 4`` (CIFAR-10 and -100);
    the paper's text quotes α = 20, β = 3 for CIFAR-100.
    """

    @dataclass
    class Config(AdversarialConfig):
        mse_weight: float = 20.0  # weight of the class-weighted MSE of logit differences (paper α)
        ce_weight: float = 4.0  # weight of the soft-label cross-entropy (paper β)
        class_weight_temperature: float = 4.0  # T of the clean probabilities behind the class weights

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        self.class_means = ClassMeanProbabilities(self.num_classes, config.class_weight_temperature)

    def training_loss(self, logits_natural: Tensor, logits_adversarial: Tensor, target: Tensor) -> Tensor:
        return ikl_at_loss(logits_natural, logits_adversarial, target, self.class_means.weights(logits_natural),
                           mse_weight=self.config.mse_weight, ce_weight=self.config.ce_weight)

    def observe(self, logits_natural: Tensor, target: Tensor) -> None:
        self.class_means.observe(logits_natural, target)

    def on_epoch_end(self, epoch: int) -> None:
        super().on_epoch_end(epoch)
        self.class_means.end_epoch()

    def extra_state(self) -> dict[str, Tensor]:
        return self.class_means.state()

    def load_extra_state(self, state: dict[str, Tensor]) -> None:
        self.class_means.load_state(state)
