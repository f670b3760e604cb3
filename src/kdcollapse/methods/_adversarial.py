"""What the adversarial-training methods (``trades``, ``ikl_at``) share.

Each training step: (1) the TRADES inner maximisation (Zhang et al., ICML 2019) on the student in eval
mode, :func:`kdcollapse.adversarial.trades_attack`, on the [0, 1] images behind the trainer's
standardised inputs; (2) optionally an adversarial weight perturbation (AWP, Wu et al., NeurIPS 2020)
of the student before the loss; (3) the method's loss of the natural and adversarial logits, student
in train mode. Options of the improved TRADES baseline of the DKL paper (§4.1): a linear ramp of ε
(Addepalli et al. 2022), AWP, and an exponential moving average of the weights for evaluation.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from kdcollapse.adversarial import Normalized, parse_eps, trades_attack
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.methods._base import Method
from kdcollapse.distributed import all_reduce_sum


@dataclass
class AdversarialConfig:
    """The ``method:`` keys shared by ``trades`` and ``ikl_at``. Radii are in [0, 1] pixel units and
    may be written as fractions (``"8/255"``). Epochs are counted from 1, as in ``metrics.jsonl``."""

    norm: Literal["Linf", "L2"] = "Linf"
    eps: float | str = "8/255"  # radius ε of the inner attack
    step_size: float | str = "2/255"  # its step (scaled with ε during the warm-up)
    steps: int = 10
    eps_warmup_epochs: int = 0  # ε·min(1, epoch/N) in epoch 1..N, then ε; 0: ε from the start
    awp_gamma: float = 0.0  # size γ of the adversarial weight perturbation; 0: no AWP
    awp_from_epoch: int = 10  # first epoch with AWP
    ema_decay: float = 0.0  # decay of the weight average used for evaluation and the model file; 0: none
    ema_every: Literal["step", "epoch"] = "epoch"  # when the average is updated
    ema_start_epoch: int = 1  # up to the end of this epoch the average copies the weights


def _check_config(cfg: AdversarialConfig) -> tuple[float, float]:
    """ConfigError naming the key for values outside their range; returns (ε, step size)."""
    try:
        eps = parse_eps(cfg.eps, norm=cfg.norm, name="method.eps")
        step = parse_eps(cfg.step_size, norm=cfg.norm, name="method.step_size")
    except KdcollapseError as err:
        raise ConfigError(str(err)) from None
    for key, value, low in (("steps", cfg.steps, 1), ("eps_warmup_epochs", cfg.eps_warmup_epochs, 0),
                            ("awp_from_epoch", cfg.awp_from_epoch, 1), ("ema_start_epoch", cfg.ema_start_epoch, 1)):
        if value < low:
            raise ConfigError(f"method.{key} must be >= {low}, got {value}")
    if not (math.isfinite(cfg.awp_gamma) and cfg.awp_gamma >= 0):
        raise ConfigError(f"method.awp_gamma must be >= 0 (0 turns AWP off), got {cfg.awp_gamma}")
    if not 0 <= cfg.ema_decay < 1:
        raise ConfigError(f"method.ema_decay must lie in [0, 1) (0 turns the average off), got {cfg.ema_decay}")
    return eps, step


def eps_schedule(eps: float, warmup_epochs: int, epoch: int) -> float:
    """ε in (0-based) ``epoch``: ε·min(1, (epoch + 1)/N) for a warm-up of N epochs, else ε.

    The official IKL-AT recipe ramps over the whole run (N = epochs: ε·e/E in epoch e of E)."""
    return eps if warmup_epochs <= 0 else eps * min(1.0, (epoch + 1) / warmup_epochs)


class WeightPerturbation:
    """Adversarial weight perturbation (Wu et al., NeurIPS 2020, Algorithm 1).

    ``perturb`` moves every weight matrix / kernel W (parameters with ≥ 2 dimensions) of the model to
    W + γ·‖W‖·g/‖g‖, g = ∇_W of the training loss: one normalised ascent step, per tensor. The gradient
    is taken on a proxy copy of the model (so the model's BatchNorm statistics and gradients are
    untouched); ``restore`` subtracts the same v after the optimizer step, so the update is
    w ← (w + v) − η∇L(w + v) − v. Under DDP the proxy gradients are averaged over the processes, so
    every process applies the same v. Not an ``nn.Module``: the proxy stays out of the method's
    parameters, state dict and DDP.
    """

    def __init__(self, gamma: float):
        self.gamma = gamma
        self.proxy: nn.Module | None = None
        self.applied: dict[str, Tensor] = {}

    def perturb(self, model: nn.Module, loss_fn: Callable[[nn.Module], Tensor]) -> None:
        """Add v to ``model``'s weights; ``loss_fn(network)`` is the training loss of a network."""
        if self.applied:
            raise RuntimeError("the previous weight perturbation was not restored")
        if self.proxy is None:
            self.proxy = copy.deepcopy(model)
        self.proxy.load_state_dict(model.state_dict())
        self.proxy.train()
        names, params = zip(*[(n, p) for n, p in self.proxy.named_parameters() if p.ndim > 1])
        grads = torch.autograd.grad(loss_fn(self.proxy), params, allow_unused=True)
        grads = [torch.zeros_like(p) if g is None else g for p, g in zip(params, grads)]
        if dist.is_available() and dist.is_initialized():
            flat = all_reduce_sum(torch.cat([g.flatten() for g in grads])) / dist.get_world_size()
            grads = list(flat.split([g.numel() for g in grads]))
        weights = dict(model.named_parameters())
        with torch.no_grad():
            for name, g in zip(names, grads):
                w = weights[name]
                v = (self.gamma * w.norm() / (g.norm() + 1e-20)) * g.view_as(w)
                w.add_(v)
                self.applied[name] = v

    @torch.no_grad()
    def restore(self, model: nn.Module) -> None:
        """Remove the perturbation added by the last :meth:`perturb` (no-op if none is applied)."""
        weights = dict(model.named_parameters())
        for name, v in self.applied.items():
            weights[name].sub_(v)
        self.applied = {}


class WeightAverage(nn.Module):
    """An exponential moving average of a model's state, parameters and buffers (BatchNorm statistics
    too): avg ← d·avg + (1 − d)·w. A submodule of the method, so it moves with ``.to()`` and is saved in
    the checkpoint; its parameters do not require gradients, so no optimizer sees them."""

    def __init__(self, model: nn.Module, decay: float):
        super().__init__()
        self.decay = decay
        self.model = copy.deepcopy(model).requires_grad_(False)

    @torch.no_grad()
    def update(self, model: nn.Module, *, copy_only: bool = False) -> None:
        """One step of the average towards ``model``'s current state (``copy_only``: set it equal)."""
        for avg, current in zip(self.model.state_dict().values(), model.state_dict().values()):
            if copy_only or not avg.is_floating_point():
                avg.copy_(current)
            else:
                avg.lerp_(current, 1 - self.decay)


class AdversarialTraining(Method):
    """Base of ``trades`` and ``ikl_at``: attack, AWP, ε ramp and weight average; subclasses give
    :meth:`training_loss`. No teacher."""

    Config = AdversarialConfig

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        if self.label_smoothing:
            raise ConfigError(f"method '{self.name}' uses plain cross-entropy (as in its paper); "
                              "set train.label_smoothing=0")
        self.eps, self.step_size = _check_config(config)
        self.current_eps = eps_schedule(self.eps, config.eps_warmup_epochs, 0)
        self.awp = WeightPerturbation(config.awp_gamma) if config.awp_gamma > 0 else None
        self.average = WeightAverage(student, config.ema_decay) if config.ema_decay > 0 else None

    # --- the loss, given by each method -------------------------------------------------------------
    def training_loss(self, logits_natural: Tensor, logits_adversarial: Tensor, target: Tensor) -> Tensor:
        """The whole training loss (cross-entropy included) of the natural and adversarial logits."""
        raise NotImplementedError

    def observe(self, logits_natural: Tensor, target: Tensor) -> None:
        """Sees the (detached) natural logits of every training step; for epoch statistics."""

    # --- the step -----------------------------------------------------------------------------------
    def forward(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        if x.dim() != 4:
            raise KdcollapseError(f"method '{self.name}' trains on images (B, C, H, W); got inputs of "
                                  f"shape {tuple(x.shape)} (a vector dataset?)")
        x_adv = self.adversarial_inputs(x)
        if self.awp is not None and self.epoch + 1 >= self.config.awp_from_epoch:
            self.awp.perturb(self.student, lambda net: self.training_loss(net(x), net(x_adv), y))
        logits_adv = self.student(x_adv)  # adversarial first, as the official code (BN statistics order)
        logits = self.student(x)
        loss = self.training_loss(logits, logits_adv, y)
        self.observe(logits.detach(), y)
        ce = F.cross_entropy(logits.detach(), y)
        return {"loss": loss, "logits": logits, "ce": ce, "robust": loss.detach() - ce,
                "adv_acc": 100 * (logits_adv.detach().argmax(1) == y).float().mean(),
                "eps": torch.tensor(self.current_eps, device=x.device)}

    def adversarial_inputs(self, x: Tensor) -> Tensor:
        """x' for the standardised inputs ``x``: the TRADES inner maximiser at the current ε, run on the
        images u = x·std + mean in [0, 1] and standardised back."""
        mean, std = self._normalization(x)
        images = (x * std + mean).clamp(0.0, 1.0)
        images_adv = trades_attack(Normalized(self.student, mean.flatten(), std.flatten()), images,
                                   norm=self.config.norm, eps=self.current_eps,
                                   step_size=self.step_size * self.current_eps / self.eps, steps=self.config.steps)
        return (images_adv - mean) / std

    def _normalization(self, x: Tensor) -> tuple[Tensor, Tensor]:
        shape = (1, -1, 1, 1)
        mean = torch.tensor(self.input_mean, dtype=x.dtype, device=x.device).view(shape)
        std = torch.tensor(self.input_std, dtype=x.dtype, device=x.device).view(shape)
        return mean, std

    # --- hooks --------------------------------------------------------------------------------------
    def on_epoch_start(self, epoch: int) -> None:
        super().on_epoch_start(epoch)
        self.current_eps = eps_schedule(self.eps, self.config.eps_warmup_epochs, epoch)

    def after_step(self) -> None:
        if self.awp is not None:
            self.awp.restore(self.student)
        if self.average is not None and self.config.ema_every == "step":
            self.average.update(self.student, copy_only=self.epoch + 1 <= self.config.ema_start_epoch)

    def on_epoch_end(self, epoch: int) -> None:
        if self.average is not None and self.config.ema_every == "epoch":
            self.average.update(self.student, copy_only=epoch + 1 <= self.config.ema_start_epoch)

    @property
    def sums_batch_gradients(self) -> bool:
        return self.awp is None

    def inference_model(self) -> nn.Module:
        return self.student if self.average is None else self.average.model

    def predict(self, x: Tensor) -> Tensor:
        return self.inference_model()(x)
