"""FAB-T: the targeted Fast Adaptive Boundary attack (Croce & Hein, "Minimally distorted adversarial
examples with a fast adaptive boundary attack", ICML 2020), ℓ∞ and ℓ2."""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.adversarial._common import (
    Model,
    attack_in_rounds,
    check_count,
    check_inputs,
    check_norm_eps,
    eval_mode,
    logits_of,
    loss_and_grad,
    lp_norm,
    per_sample,
    predict,
)
from kdcollapse.errors import KdcollapseError


def project_onto_hyperplane_in_box(p: Tensor, w: Tensor, c: Tensor, norm: str) -> Tensor:
    """The smallest step δ (in ℓ∞ or ℓ2) with ⟨w, δ⟩ = c and p + δ ∈ [0, 1]^d, per row.

    p, w: (B, D); c: (B,). This is proj_p(p, π, C) − p of the FAB paper, π the hyperplane.
    Writing s = sign(c) and w' = s·w, the optimum moves coordinate i towards the side of sign(w'_i)
    by min(τ·a_i/|w'_i|, r_i), r_i the room left in the box on that side and a_i = |w'_i| (ℓ∞) or
    w'_i² (ℓ2), with τ ≥ 0 the smallest root of the increasing piecewise-linear
    h(τ) = Σ_i min(a_i τ, |w'_i| r_i) = |c|, found by sorting the breakpoints r_i |w'_i| / a_i. When the
    box does not reach the hyperplane (h(∞) < |c|), every coordinate goes to the bound.
    """
    s = torch.sign(c)[:, None]
    w_s = s * w
    direction = torch.sign(w_s)
    room = torch.where(w_s > 0, 1 - p, p)
    abs_w = w_s.abs()
    rate = torch.ones_like(abs_w) if norm == "Linf" else abs_w  # dδ_i/dτ = a_i / |w'_i| before saturation
    slope = abs_w * rate  # a_i
    cap = abs_w * room  # |w'_i| r_i
    breakpoint = torch.where(slope > 0, room / rate.clamp_min(1e-30), torch.full_like(room, float("inf")))

    b_sorted, order = breakpoint.sort(1)
    slope_sorted, cap_sorted = slope.gather(1, order), cap.gather(1, order)
    cap_before = cap_sorted.cumsum(1) - cap_sorted  # Σ_{i<k} cap
    slope_from = slope_sorted.sum(1, keepdim=True) - slope_sorted.cumsum(1) + slope_sorted  # Σ_{i≥k} a
    finite = torch.isfinite(b_sorted)
    h_at_b = cap_before + cap_sorted + torch.where(finite, b_sorted * (slope_from - slope_sorted), 0)
    target = c.abs()[:, None]
    reached = finite & (h_at_b >= target)
    feasible = reached.any(1, keepdim=True)
    k = reached.to(torch.uint8).argmax(1, keepdim=True)  # first breakpoint at which h reaches |c|
    tau = (target - cap_before.gather(1, k)) / slope_from.gather(1, k).clamp_min(1e-30)
    tau_all = torch.where(finite, b_sorted, 0).amax(1, keepdim=True)  # saturates every coordinate
    tau = torch.where(feasible, tau.clamp_min(0), tau_all)
    return direction * torch.minimum(tau * rate, room)


def _fab_targeted_run(
    model: Model, x: Tensor, y: Tensor, target: Tensor, *, norm: str, n_iter: int, alpha_max: float,
    eta: float, beta: float,
) -> tuple[Tensor, Tensor]:
    """FAB iterations (Croce & Hein 2020) towards the boundary between ``y`` and ``target``.

    Each step linearises g = f_target − f_y at the iterate x^(i), projects both x^(i) and the original
    x onto {g_lin = 0} ∩ box (δ^(i), δ_orig), and moves to
    P_box((1 − α)(x^(i) + η δ^(i)) + α(x + η δ_orig)),
    α = min(‖δ^(i)‖/(‖δ^(i)‖ + ‖δ_orig‖), α_max).
    On reaching an adversarial point it is recorded if closer than the best so far, and the iterate
    steps back towards x: x^(i+1) ← x + β(x^(i+1) − x). Returns (closest adversarial or x, its distance
    or inf).
    """
    flat = x.flatten(1)
    x_i = x.clone()
    best, best_dist = x.clone(), torch.full((x.shape[0],), float("inf"), device=x.device, dtype=x.dtype)
    rows = torch.arange(x.shape[0], device=x.device)
    for _ in range(n_iter):
        g, w, _ = loss_and_grad(model, x_i, lambda logits: logits[rows, target] - logits[rows, y])
        w = w.flatten(1)
        x_i_flat = x_i.flatten(1)
        # g(x^(i)) + ⟨w, z − x^(i)⟩ = 0, as ⟨w, δ⟩ = c from either starting point
        c_i = -g
        c_orig = -g - (w * (flat - x_i_flat)).sum(1)
        d_i, d_orig = project_onto_hyperplane_in_box(
            torch.cat([x_i_flat, flat]), torch.cat([w, w]), torch.cat([c_i, c_orig]), norm
        ).chunk(2)
        n_i, n_orig = lp_norm(d_i, norm).clamp_min(1e-8), lp_norm(d_orig, norm).clamp_min(1e-8)
        alpha = (n_i / (n_i + n_orig)).clamp(max=alpha_max)[:, None]
        x_i = ((1 - alpha) * (x_i_flat + eta * d_i) + alpha * (flat + eta * d_orig)).clamp(0, 1).view_as(x)

        adversarial = predict(model, x_i) != y
        dist = lp_norm(x_i - x, norm)
        closer = adversarial & (dist < best_dist)
        best = torch.where(per_sample(closer, x), x_i, best)
        best_dist = torch.where(closer, dist, best_dist)
        x_i = torch.where(per_sample(adversarial, x), x + beta * (x_i - x), x_i)
    return best, best_dist


def fab_attack(
    model: Model,
    x: Tensor,
    y: Tensor,
    *,
    norm: str = "Linf",
    eps: float | None,
    n_iter: int = 100,
    n_targets: int = 9,
    alpha_max: float = 0.1,
    eta: float = 1.05,
    beta: float = 0.9,
) -> Tensor:
    """FAB-T (Croce & Hein, ICML 2020), the targeted version used by AutoAttack "standard".

    A minimal-distortion attack: for each target class (ranked 2, ..., n_targets + 1 by the clean
    logits; fewer when there are fewer than 10 classes), ``n_iter`` FAB steps from x on the points not
    yet broken. Defaults are AutoAttack's (α_max = 0.1, η = 1.05, β = 0.9, 100 iterations, 9 targets,
    no random restart).

    Args:
        eps: only adversarial examples with ‖x_adv − x‖ ≤ eps count; ``None`` keeps the closest one
            found at any distance (then x_adv may leave any ε-ball).
    Returns:
        (B, ...) in the [0, 1] box: the closest adversarial example found (within eps), else x.
    """
    check_inputs(x, y, model)
    check_norm_eps(norm, 1.0 if eps is None else eps)
    check_count("n_iter", n_iter)
    check_count("n_targets", n_targets)
    if not (0 <= alpha_max <= 1 and eta >= 1 and 0 < beta <= 1):
        raise KdcollapseError(f"need 0 ≤ alpha_max ≤ 1, eta ≥ 1, 0 < beta ≤ 1; got {alpha_max}, {eta}, {beta}")
    bound = float("inf") if eps is None else eps
    with eval_mode(model):
        with torch.no_grad():
            clean_logits = logits_of(model, x)
        ranked = clean_logits.argsort(1, descending=True)
        n_targets = min(n_targets, clean_logits.shape[1] - 1)

        def run(r: int, idx: Tensor) -> Tensor:
            best, dist = _fab_targeted_run(model, x[idx], y[idx], ranked[idx, r + 1], norm=norm, n_iter=n_iter,
                                           alpha_max=alpha_max, eta=eta, beta=beta)
            return torch.where(per_sample(dist <= bound, best), best, x[idx])

        return attack_in_rounds(model, x, y, n_targets, run)
