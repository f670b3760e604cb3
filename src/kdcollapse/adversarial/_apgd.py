"""Auto-PGD (Croce & Hein, "Reliable evaluation of adversarial robustness with an ensemble of diverse
parameter-free attacks", ICML 2020): PGD with momentum and a step size that halves at checkpoints
when progress stalls, restarting from the best point found."""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.adversarial._common import (
    Model,
    Objective,
    attack_in_rounds,
    check_count,
    check_inputs,
    check_norm_eps,
    eval_mode,
    logits_of,
    loss_and_grad,
    num_classes,
    per_sample,
    project,
    random_init,
    steepest_ascent,
)
from kdcollapse.adversarial._losses import cross_entropy, dlr_loss, dlr_targeted_loss, require_classes
from kdcollapse.errors import KdcollapseError, unknown_choice

APGD_LOSSES = ("ce", "dlr")
MOMENTUM = 0.75  # α in x^(k+1) = P(x^(k) + α(z^(k+1) − x^(k)) + (1 − α)(x^(k) − x^(k−1)))


def apgd_checkpoints(n_iter: int) -> list[int]:
    """The checkpoints w_j = ⌈p_j · N_iter⌉ at which APGD may halve its step size, with
    p_0 = 0, p_1 = 0.22 and p_{j+1} = p_j + max(p_j − p_{j−1} − 0.03, 0.06) (Croce & Hein 2020).

    For N_iter = 100: [22, 41, 57, 70, 80, 87, 93, 99].
    """
    p_prev, p, out = 0, 22, []  # in hundredths, so the schedule is exact
    while p <= 100:
        w = -(-p * n_iter // 100)
        if w > (out[-1] if out else 0):
            out.append(w)
        p_prev, p = p, p + max(p - p_prev - 3, 6)
    return out


def halve_step_size(
    n_increased: Tensor, steps_since_last: int, rho: float, halved_at_last: Tensor, f_max: Tensor,
    f_max_at_last: Tensor,
) -> Tensor:
    """APGD's test at a checkpoint w_j (Croce & Hein 2020), per sample (B,) bool: halve η when

    1. Σ_{i=w_{j−1}}^{w_j−1} 1[f(x^(i+1)) > f(x^(i))] < ρ·(w_j − w_{j−1})   (too few steps improved), or
    2. η^(w_{j−1}) = η^(w_j) and f_max^(w_{j−1}) = f_max^(w_j)          (not halved, no progress).
    """
    return (n_increased < rho * steps_since_last) | (~halved_at_last & (f_max <= f_max_at_last))


def _apgd_run(
    model: Model, x: Tensor, y: Tensor, objective: Objective, *, norm: str, eps: float, n_iter: int,
    rho: float, generator: torch.Generator | None,
) -> Tensor:
    """One APGD run from a random start (Croce & Hein 2020), per-sample step sizes.

    At each checkpoint w_j (:func:`apgd_checkpoints`) a sample whose :func:`halve_step_size` test
    holds gets η halved and its iterate reset to its best point x_max (condition 2 is not tested at the
    first checkpoint, which has no predecessor).
    Returns a misclassified iterate where one was met, else the highest-objective point x_max.
    """
    x_cur = random_init(x, norm, eps, generator)
    f, grad, logits = loss_and_grad(model, x_cur, objective)
    fooled = logits.argmax(1) != y
    x_fooled = x_cur.clone()
    x_max, f_max, grad_max = x_cur.clone(), f.clone(), grad.clone()
    eta = torch.full_like(f, 2 * eps)  # η^(0) = 2ε
    x_prev, f_prev = x_cur, f
    n_increased = torch.zeros_like(f)
    halved_at_last = torch.ones_like(fooled)
    f_max_at_last = f_max.clone()
    checkpoints, w_last = apgd_checkpoints(n_iter), 0
    for k in range(n_iter):
        z = project(x_cur + per_sample(eta, x) * steepest_ascent(grad, norm), x, norm, eps)
        a = 1.0 if k == 0 else MOMENTUM
        x_prev, x_cur = x_cur, project(x_cur + a * (z - x_cur) + (1 - a) * (x_cur - x_prev), x, norm, eps)
        f, grad, logits = loss_and_grad(model, x_cur, objective)

        newly = logits.argmax(1) != y
        x_fooled = torch.where(per_sample(newly, x), x_cur, x_fooled)
        fooled |= newly
        n_increased += f > f_prev
        better = f > f_max
        x_max = torch.where(per_sample(better, x), x_cur, x_max)
        grad_max = torch.where(per_sample(better, x), grad, grad_max)
        f_max = torch.where(better, f, f_max)
        f_prev = f

        if k + 1 in checkpoints:
            w = k + 1
            halve = halve_step_size(n_increased, w - w_last, rho, halved_at_last, f_max, f_max_at_last)
            eta = torch.where(halve, eta / 2, eta)
            x_cur = torch.where(per_sample(halve, x), x_max, x_cur)
            grad = torch.where(per_sample(halve, x), grad_max, grad)
            f_prev = torch.where(halve, f_max, f_prev)
            halved_at_last, f_max_at_last, w_last = halve, f_max.clone(), w
            n_increased.zero_()
    return torch.where(per_sample(fooled, x), x_fooled, x_max)


def _check_apgd(x: Tensor, y: Tensor, norm: str, eps: float, n_iter: int, rho: float) -> None:
    check_inputs(x, y)
    check_norm_eps(norm, eps)
    check_count("n_iter", n_iter)
    if not 0 < rho <= 1:
        raise KdcollapseError(f"rho must lie in (0, 1], got {rho!r}")


def apgd_attack(
    model: Model,
    x: Tensor,
    y: Tensor,
    *,
    norm: str = "Linf",
    eps: float,
    n_iter: int = 100,
    loss: str = "ce",
    n_restarts: int = 1,
    rho: float = 0.75,
    generator: torch.Generator | None = None,
) -> Tensor:
    """APGD-CE / APGD-DLR (Croce & Hein, ICML 2020), untargeted.

    Args:
        model: callable on [0, 1] inputs (B, ...) returning logits (B, K); run in eval mode.
        x: clean inputs in [0, 1], (B, ...); y: true labels (B,).
        loss: ``"ce"`` (cross-entropy) or ``"dlr"`` (needs ≥ 3 classes).
        n_restarts: random restarts, each on the points not yet misclassified (1 in AutoAttack
            "standard").
        rho: ρ of the step-size condition 1.
    Returns:
        (B, ...) inside the ε-ball ∩ [0, 1] box: an adversarial example where one was found, else
        the highest-loss point of the last run.
    """
    _check_apgd(x, y, norm, eps, n_iter, rho)
    check_count("n_restarts", n_restarts)
    if loss not in APGD_LOSSES:
        raise KdcollapseError(unknown_choice("APGD loss", loss, APGD_LOSSES))
    if loss == "dlr":
        require_classes(num_classes(model, x), 3, "APGD-DLR")
    loss_fn = cross_entropy if loss == "ce" else dlr_loss

    def run(_: int, idx: Tensor) -> Tensor:
        y_i = y[idx]
        return _apgd_run(model, x[idx], y_i, lambda logits: loss_fn(logits, y_i), norm=norm, eps=eps,
                         n_iter=n_iter, rho=rho, generator=generator)

    with eval_mode(model):
        return attack_in_rounds(model, x, y, n_restarts, run)


def apgd_targeted_attack(
    model: Model,
    x: Tensor,
    y: Tensor,
    *,
    norm: str = "Linf",
    eps: float,
    n_iter: int = 100,
    n_targets: int = 9,
    rho: float = 0.75,
    generator: torch.Generator | None = None,
) -> Tensor:
    """APGD-T (Croce & Hein, ICML 2020): APGD on the targeted DLR loss, once per target class.

    The targets of a point are the classes ranked 2, 3, ..., n_targets + 1 by its clean logits (the
    top-9 non-top classes in AutoAttack "standard"; fewer when there are fewer than 10 classes), each
    run from a fresh random start on the points not yet misclassified. Needs ≥ 4 classes.
    Returns (B, ...) like :func:`apgd_attack`.
    """
    _check_apgd(x, y, norm, eps, n_iter, rho)
    check_count("n_targets", n_targets)
    with eval_mode(model):
        with torch.no_grad():
            clean_logits = logits_of(model, x)
        require_classes(clean_logits.shape[1], 4, "APGD-T")
        ranked = clean_logits.argsort(1, descending=True)
        n_targets = min(n_targets, clean_logits.shape[1] - 1)

        def run(r: int, idx: Tensor) -> Tensor:
            y_i, t_i = y[idx], ranked[idx, r + 1]
            return _apgd_run(model, x[idx], y_i, lambda logits: dlr_targeted_loss(logits, y_i, t_i),
                             norm=norm, eps=eps, n_iter=n_iter, rho=rho, generator=generator)

        return attack_in_rounds(model, x, y, n_targets, run)
