"""Projected gradient ascent: PGD (Madry et al., ICLR 2018) and the TRADES inner maximisation."""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.adversarial._common import (
    Model,
    Objective,
    check_count,
    check_inputs,
    check_norm_eps,
    eval_mode,
    gaussian,
    logits_of,
    loss_and_grad,
    project,
    random_init,
    steepest_ascent,
)
from kdcollapse.adversarial._losses import cross_entropy, dlr_loss, kl_from_natural
from kdcollapse.errors import KdcollapseError, unknown_choice

PGD_LOSSES = ("ce", "dlr")


def projected_ascent(
    model: Model, x: Tensor, x_adv: Tensor, objective: Objective, *, norm: str, eps: float, step_size: float,
    steps: int,
) -> Tensor:
    """``steps`` steps x ← Π(x + step_size · u(∇ objective)), u the steepest-ascent unit step of the
    norm and Π the map into the ε-ball ∩ [0, 1] box; returns the last iterate (detached)."""
    x_adv = project(x_adv, x, norm, eps)
    with eval_mode(model):
        for _ in range(steps):
            _, grad, _ = loss_and_grad(model, x_adv, objective)
            x_adv = project(x_adv + step_size * steepest_ascent(grad, norm), x, norm, eps)
    return x_adv.detach()


def _check_steps(step_size: float, steps: int) -> None:
    check_count("steps", steps, minimum=0)
    if not step_size > 0:
        raise KdcollapseError(f"step_size must be positive, got {step_size!r}")


def pgd_attack(
    model: Model,
    x: Tensor,
    y: Tensor,
    *,
    norm: str = "Linf",
    eps: float,
    step_size: float,
    steps: int,
    random_start: bool = True,
    loss: str = "ce",
    targeted: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """PGD (Madry et al., ICLR 2018): maximise ``loss`` over the ε-ball ∩ [0, 1] box.

    Args:
        model: callable on [0, 1] inputs (B, ...) returning logits (B, K); run in eval mode.
        x: clean inputs in [0, 1], (B, ...). y: (B,) labels, or target classes when ``targeted``.
        norm: ``"Linf"`` (sign steps) or ``"L2"`` (normalised-gradient steps).
        random_start: start uniformly in the ℓ∞ cube / on the ℓ2 sphere of radius ε, else at x.
        loss: ``"ce"`` or ``"dlr"`` (Croce & Hein 2020). ``targeted=True`` descends the cross-entropy
            of the target class ``y`` instead (``loss="ce"`` only).
    Returns:
        the last iterate, (B, ...), inside the ε-ball and the box.
    """
    check_inputs(x, y, model)
    check_norm_eps(norm, eps)
    _check_steps(step_size, steps)
    if loss not in PGD_LOSSES:
        raise KdcollapseError(unknown_choice("PGD loss", loss, PGD_LOSSES))
    if targeted and loss != "ce":
        raise KdcollapseError("targeted PGD supports loss='ce' only; use apgd_targeted_attack for targeted DLR")
    if targeted:
        objective = lambda logits: -cross_entropy(logits, y)  # noqa: E731
    else:
        objective = lambda logits: (cross_entropy if loss == "ce" else dlr_loss)(logits, y)  # noqa: E731
    start = random_init(x, norm, eps, generator) if random_start else x
    return projected_ascent(model, x, start, objective, norm=norm, eps=eps, step_size=step_size, steps=steps)


def trades_attack(
    model: Model,
    x: Tensor,
    *,
    norm: str = "Linf",
    eps: float = 8 / 255,
    step_size: float = 2 / 255,
    steps: int = 10,
    generator: torch.Generator | None = None,
) -> Tensor:
    """The inner maximisation of TRADES (Zhang et al., ICML 2019): from x + 0.001·N(0, I), ``steps``
    sign steps on KL(P_nat ‖ P_adv), projected onto the ε-ball ∩ [0, 1] box, model in eval mode.

    Defaults are the paper's CIFAR setting (ε = 8/255, 10 steps of 2/255). Needs no labels.
    Returns the adversarial inputs (B, ...), detached.
    """
    check_inputs(x)
    check_norm_eps(norm, eps)
    _check_steps(step_size, steps)
    with eval_mode(model), torch.no_grad():
        log_p_natural = torch.log_softmax(logits_of(model, x), dim=1)
    start = x + 0.001 * gaussian(x.shape, x, generator)
    objective = lambda logits: kl_from_natural(logits, log_p_natural)  # noqa: E731
    return projected_ascent(model, x, start, objective, norm=norm, eps=eps, step_size=step_size, steps=steps)
