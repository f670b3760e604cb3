"""DKL as the distillation loss (DKL paper eq. 5 with a frozen teacher), and the steps of its Table 1 ablation
that lead from it to IKL: breaking the asymmetry (row c) and global information (row d)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdcollapse.errors import ConfigError
from kdcollapse.losses import dkl_loss, ikl_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._class_means import ClassMeanProbabilities
from kdcollapse.methods._distill import Distiller, check_config, loss


def equals(m, x, y):
    """ce_weight·CE + kd_weight·τ²·dkl(z_t/τ, z_s/τ; α, β), or with ``breaking_asymmetry`` ikl on z/τ."""
    cfg, logits = m.config, m.student(x)
    tau, teacher = cfg.temperature, m.teacher_logits(x)
    if cfg.breaking_asymmetry:
        weights = None if m.class_means is None else m.class_means.weights(logits)
        inner = loss("ikl")(logits / tau, teacher / tau, class_weights=weights, target=y, mse_weight=cfg.alpha,
                            ce_weight=cfg.beta)
    else:
        inner = loss("dkl")(teacher / tau, logits / tau, cfg.alpha, cfg.beta)
    return cfg.ce_weight * m.cross_entropy(logits, y) + cfg.kd_weight * tau**2 * inner


@register_method("dkl_kd", equals=equals, checks=({"breaking_asymmetry": True, "alpha": 2.0},
                                                  {"breaking_asymmetry": True, "global_information": True}))
class DKLKD(Distiller):
    """ce_weight·CE(z_s, y) + kd_weight·τ²·DKL(z_t/τ, z_s/τ; α, β) (DKL paper eq. 5).

    With α = β = 1 the gradients equal those of the ``kd`` method (Lemma 1): the teacher is frozen, so
    the wMSE term has no gradient (the paper's eq. 6 "asymmetry") and only the soft-label CE acts. It is
    the control for ``ikl_kd``, which breaks that asymmetry. Logged parts: ``ce``, ``dkl``.

    The DKL paper's Table 1 ablation, on one scale (everything on z/τ, times kd_weight·τ²):
    ``breaking_asymmetry`` lets the wMSE's gradient reach the student, with the sample-wise weights
    S(softmax(z_t/τ)) (row c: :func:`~kdcollapse.losses.ikl_loss` without class weights), and
    ``global_information`` replaces those weights by the previous epoch's class means of softmax(z_t/τ)
    (row d, IKL; the table is ``extra_state`` as in ``ikl_kd``). ``ikl_kd`` is IKL in the official code's
    conventions (raw-logit wMSE, no τ² on the soft CE), for the papers' recipes.
    """

    @dataclass
    class Config:
        temperature: float = 4.0  # τ
        ce_weight: float = 0.1
        kd_weight: float = 0.9
        alpha: float = 1.0  # wMSE weight (inactive with a frozen teacher unless breaking_asymmetry)
        beta: float = 1.0  # soft-label CE weight
        breaking_asymmetry: bool = False  # Table 1 (c): the wMSE trains the student
        global_information: bool = False  # Table 1 (d): class-mean weights; needs breaking_asymmetry

        def __post_init__(self):
            check_config(self, positive=("temperature",),
                         non_negative=("ce_weight", "kd_weight", "alpha", "beta"))
            if self.global_information and not self.breaking_asymmetry:
                raise ConfigError("method.global_information weights the wMSE, which trains nothing while the "
                                  "asymmetry is kept: set method.breaking_asymmetry=true too")

    def __init__(self, student, config, *, num_classes, **kwargs):
        super().__init__(student, config, num_classes=num_classes, **kwargs)
        self.class_means = ClassMeanProbabilities(num_classes, config.temperature) \
            if config.global_information else None

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        tau, teacher = cfg.temperature, self.teacher_logits(x)
        if cfg.breaking_asymmetry:
            weights = None if self.class_means is None else self.class_means.weights(logits)
            if self.class_means is not None and self.training:
                self.class_means.observe(teacher, y)
            loss = ikl_loss(logits / tau, teacher / tau, class_weights=weights, target=y, mse_weight=cfg.alpha,
                            ce_weight=cfg.beta)
        else:
            loss = dkl_loss(teacher / tau, logits / tau, cfg.alpha, cfg.beta)
        dkl = cfg.kd_weight * tau**2 * loss
        return {"loss": ce + dkl, "logits": logits, "ce": ce, "dkl": dkl}

    def on_epoch_end(self, epoch: int) -> None:
        if self.class_means is not None:
            self.class_means.end_epoch()

    def extra_state(self) -> dict[str, torch.Tensor]:
        return {} if self.class_means is None else self.class_means.state()

    def load_extra_state(self, state: dict[str, torch.Tensor]) -> None:
        if self.class_means is not None:
            self.class_means.load_state(state)
