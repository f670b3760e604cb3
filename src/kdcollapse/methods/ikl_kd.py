"""Knowledge distillation with the Improved KL divergence (Cui et al., DKL paper eq. 10, §4.2)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdcollapse.errors import ConfigError
from kdcollapse.losses import ikl_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._class_means import ClassMeanProbabilities
from kdcollapse.methods._distill import Distiller, check_config, loss, warmup_factor


def equals(m, x, y):
    """ce_weight·CE + warm-up·ikl(z_s, z_t; w̄_y, τ) with the previous epoch's class table."""
    cfg, logits = m.config, m.student(x)
    ikl = loss("ikl")(logits, m.teacher_logits(x), class_weights=m.class_means.weights(logits), target=y,
                      mse_weight=cfg.mse_weight, ce_weight=cfg.soft_ce_weight, temperature=cfg.temperature)
    return cfg.ce_weight * m.cross_entropy(logits, y) + warmup_factor(m.epoch, cfg.warmup_epochs) * ikl


@register_method("ikl_kd", equals=equals)
class IKLKD(Distiller):
    """ce_weight·CE(z_s, y) + min(epoch/warmup, 1)·IKL(z_t, z_s; w̄_y) (DKL paper eq. 10).

    IKL = mse_weight·¼·Σ_jk ((t_j − t_k) − (s_j − s_k))²·w̄_y^j w̄_y^k − soft_ce_weight·Σ_j
    softmax(t/τ)_j log softmax(s/τ)_j (see :func:`kdcollapse.losses.ikl_loss`). The weights w̄_y are
    "global information" (eq. 9), :class:`~kdcollapse.methods._class_means.ClassMeanProbabilities` of the
    teacher's softmax(z_t/T2) (``class_means.table``): row y is the mean over the previous epoch's
    training samples of class y, row-normalised; in epoch 1 every row is uniform 1/K. ``momentum`` < 1
    blends each epoch's means into the old rows (EMA). Under DDP the sums are all-reduced at the end of
    the epoch. The table and its accumulators are ``extra_state``, not buffers.

    Names: paper α (wMSE) / β (soft CE) = official code BETA / ALPHA = ``mse_weight`` /
    ``soft_ce_weight`` here. The official CIFAR-100 code leaves global information off and uses the
    sample-wise softmax(z_t/100); the CIFAR recipes here use class means of softmax(z_t/100) instead —
    both are within a few per cent of uniform. Logged parts: ``ce``, ``ikl`` (weighted and ramped).
    """

    @dataclass
    class Config:
        mse_weight: float = 1.0  # wMSE weight: paper α, official BETA
        soft_ce_weight: float = 1.0  # soft-label CE weight: paper β, official ALPHA
        temperature: float = 4.0  # τ of the soft-label CE (the wMSE uses raw logits)
        weight_temperature: float = 1.0  # T2: class weights are class means of softmax(z_t / T2)
        momentum: float = 1.0  # new rows = momentum·epoch means + (1 − momentum)·old rows; 1 replaces
        ce_weight: float = 1.0
        warmup_epochs: int = 20  # linear ramp of the whole IKL term; 0: none

        def __post_init__(self):
            check_config(self, positive=("temperature", "weight_temperature", "momentum"),
                         non_negative=("mse_weight", "soft_ce_weight", "ce_weight", "warmup_epochs"))
            if self.momentum > 1:
                raise ConfigError(f"method.momentum must be in (0, 1], got {self.momentum}")

    def __init__(self, student, config, *, num_classes, **kwargs):
        super().__init__(student, config, num_classes=num_classes, **kwargs)
        self.class_means = ClassMeanProbabilities(num_classes, config.weight_temperature, config.momentum)

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        teacher = self.teacher_logits(x)
        if self.training:
            self.class_means.observe(teacher, y)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        ikl = warmup_factor(self.epoch, cfg.warmup_epochs) * ikl_loss(
            logits, teacher, class_weights=self.class_means.weights(logits), target=y, mse_weight=cfg.mse_weight,
            ce_weight=cfg.soft_ce_weight, temperature=cfg.temperature)
        return {"loss": ce + ikl, "logits": logits, "ce": ce, "ikl": ikl}

    def on_epoch_end(self, epoch: int) -> None:
        """Replace (or blend) each class's row by the epoch's mean teacher probabilities, then reset."""
        self.class_means.end_epoch()

    def extra_state(self) -> dict[str, torch.Tensor]:
        return self.class_means.state()

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        self.class_means.load_state(state)
