"""Curriculum temperature for knowledge distillation, CTKD (Li et al., AAAI 2023), global temperature.

The temperature is learned: τ = t_start + t_end·σ(θ) with one trainable scalar θ (initialised to 1),
trained through a gradient-reversal layer, so the student's optimizer step moves τ to *increase* the
distillation loss (an adversarial, harder task), scaled by λ. The curriculum raises λ from 0 to λ_max
over the first ``curriculum_epochs`` epochs along a half cosine (official ``CosineDecay`` from
``decay_max = 0`` to ``decay_min = −λ_max`` over ``decay_loops``, epochs counted from 1).

θ is a parameter of the method: it is in the optimizer (with the official code's weight decay, as
its ``trainable_list`` includes the temperature module), in ``checkpoint.safetensors`` (``method.theta``),
so a run resumes bit-exactly, and in DDP's buckets (every rank computes the same gradient of its own
batch; DDP averages them as for the student's weights).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from kdcollapse.losses import kd_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, check_config, loss, standardized


class _ReverseGradient(torch.autograd.Function):
    """Identity forward; backward multiplies the gradient by −λ (Ganin & Lempitsky 2015)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, lambda_: float) -> torch.Tensor:
        ctx.lambda_ = lambda_
        return x.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        return -ctx.lambda_ * grad, None


def reverse_gradient(x: torch.Tensor, lambda_: float) -> torch.Tensor:
    """x in the forward pass; −λ·(upstream gradient) in the backward pass."""
    return _ReverseGradient.apply(x, lambda_)


def curriculum(epoch: int, lambda_max: float, epochs: int) -> float:
    """λ of the 0-based ``epoch``: λ_max·(1 − (cos(π·min(e, E)/E) + 1)/2), e = epoch + 1 (the official
    ``CosineDecay.get_value(epoch)`` with epochs from 1, sign flipped: the official λ runs 0 → −λ_max
    and its reversal layer multiplies by it)."""
    if epochs <= 0:
        return lambda_max
    e = min(epoch + 1, epochs)
    return lambda_max * (1 - (math.cos(e * math.pi / epochs) + 1) / 2)


def equals(m, x, y):
    """ce_weight·CE + kd_weight·kd(z_s, z_t, τ) at the learned τ (the method's reversed-gradient connector)."""
    cfg, logits = m.config, m.student(x)
    return (cfg.ce_weight * m.cross_entropy(logits, y)
            + cfg.kd_weight * loss("kd")(*standardized(cfg, logits, m.teacher_logits(x)), m.temperature()))


@register_method("ctkd", equals=equals, checks=({"logit_standardization": True},))
class CTKD(Distiller):
    """ce_weight·CE(z_s, y) + kd_weight·τ²·KL(softmax(z_t/τ) ‖ softmax(z_s/τ)), τ learned adversarially.

    Defaults: the official CIFAR-100 script (``run_cifar_distill.sh``: ``-r 0.1 -a 0.9``, ``t_start 1``,
    ``t_end 20``, cosine curriculum from 0 to 1 over 10 epochs; ImageNet: 5 epochs, weights 1 and 1).
    With ``logit_standardization`` both logits are z-scored before the KL at the learned temperature
    (the logit-standardization authors' CTKD code). Logged parts: ``ce``, ``kd`` (weighted) and
    ``temperature`` (the learned τ; not part of the loss).
    """

    teacher_reads = TeacherRequest()  # the whole logit row: τ is learned, so no fixed softmax temperature

    @dataclass
    class Config:
        ce_weight: float = 0.1
        kd_weight: float = 0.9
        t_start: float = 1.0  # τ = t_start + t_end·σ(θ): the smallest temperature
        t_end: float = 20.0  # ... and the range above it
        lambda_max: float = 1.0  # final weight of the reversed gradient (official decay_min = −1)
        curriculum_epochs: int = 10  # epochs of the cosine ramp of λ (official decay_loops)
        logit_standardization: bool = False  # z-score both logits first (Sun et al. 2024)

        def __post_init__(self):
            check_config(self, positive=("t_start", "t_end"),
                         non_negative=("ce_weight", "kd_weight", "lambda_max", "curriculum_epochs"))

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        self.theta = nn.Parameter(torch.ones(1))  # official Global_T: torch.ones(1)

    def temperature(self) -> torch.Tensor:
        """The learned τ (0-dim) with the reversed, curriculum-scaled gradient towards θ."""
        lambda_ = curriculum(self.epoch, self.config.lambda_max, self.config.curriculum_epochs)
        theta = reverse_gradient(self.theta, lambda_)
        return (self.config.t_start + self.config.t_end * torch.sigmoid(theta)).squeeze(0)

    def forward(self, x, y):
        cfg = self.config
        logits = self.student(x)
        tau = self.temperature()
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        kd = cfg.kd_weight * kd_loss(*standardized(cfg, logits, self.teacher_logits(x)), tau)
        return {"loss": ce + kd, "logits": logits, "ce": ce, "kd": kd, "temperature": tau.detach()}
