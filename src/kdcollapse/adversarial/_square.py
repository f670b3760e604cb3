"""Square Attack (Andriushchenko, Croce, Flammarion & Hein, "Square Attack: a query-efficient
black-box adversarial attack via random search", ECCV 2020), ℓ∞ and ℓ2, margin loss."""

from __future__ import annotations

import math

import torch
from torch import Tensor

from kdcollapse.adversarial._common import (
    Model,
    check_count,
    check_inputs,
    check_norm_eps,
    eval_mode,
    logits_of,
    lp_norm,
    normalize,
    per_sample,
    random_signs,
    uniform,
)
from kdcollapse.adversarial._losses import margin
from kdcollapse.errors import KdcollapseError

# The published schedule of p for 10 000 queries: p_init is halved after each of these iterations.
_P_HALVINGS = (10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000)


def square_p_schedule(iteration: int, p_init: float = 0.8, n_queries: int = 10_000, rescale: bool = False) -> float:
    """Fraction p of the image a square covers at ``iteration`` (Andriushchenko et al. 2020).

    p = p_init / 2^m with m the number of halving points {10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000}
    strictly below the iteration. ``rescale`` maps the iteration to a 10 000-query budget first; the
    AutoAttack "standard" configuration does not rescale its 5000-query run.
    """
    if rescale:
        iteration = int(iteration / n_queries * 10_000)
    return p_init / 2 ** sum(iteration > h for h in _P_HALVINGS)


def _window(h: int, w: int, s: int, like: Tensor, generator: torch.Generator | None) -> tuple[slice, slice]:
    """A uniformly random s × s window (rows, columns) of an h × w image."""
    r, c = (int(uniform((1,), like, generator).item() * (n - s + 1)) for n in (h, w))
    return slice(r, r + s), slice(c, c + s)


def _eta_rectangle(rows: int, cols: int, like: Tensor) -> Tensor:
    """Σ_k 1/(k+1)² over the concentric rectangles around the centre, unit ℓ2 norm (rows × cols)."""
    i = torch.arange(rows, device=like.device, dtype=like.dtype)[:, None]
    j = torch.arange(cols, device=like.device, dtype=like.dtype)[None, :]
    ring = torch.maximum((i - rows // 2).abs(), (j - cols // 2).abs())
    k = torch.arange(max(rows, cols) // 2 + 1, device=like.device, dtype=like.dtype)
    eta = ((ring[..., None] <= k) / (k + 1) ** 2).sum(-1)  # the (k+1)-th rectangle covers ring ≤ k
    return eta / eta.norm().clamp_min(1e-12)


def _eta(s: int, like: Tensor, generator: torch.Generator | None) -> Tensor:
    """The ℓ2 Square attack's s × s update: +η on the top half, −η on the bottom half, randomly
    transposed, unit ℓ2 norm (Andriushchenko et al. 2020, the ℓ2 attack)."""
    eta = torch.cat([_eta_rectangle(s // 2, s, like), -_eta_rectangle(s - s // 2, s, like)])
    eta = eta / eta.norm().clamp_min(1e-12)
    return eta.T if uniform((1,), like, generator).item() < 0.5 else eta


def _init_linf(x: Tensor, eps: float, generator: torch.Generator | None) -> Tensor:
    """Vertical stripes: x + ε·(±1 per channel and column)."""
    b, c, _, w = x.shape
    return (x + eps * random_signs((b, c, 1, w), x, generator)).clamp(0, 1)


def _init_l2(x: Tensor, eps: float, generator: torch.Generator | None) -> Tensor:
    """A grid of ±η tiles of side ⌊h/5⌋, scaled to ‖δ‖₂ = ε."""
    b, c, h, w = x.shape
    s = max(h // 5, 1)
    delta = torch.zeros_like(x)
    for r in range((h % s) // 2, h - s + 1, s):
        for col in range((w % s) // 2, w - s + 1, s):
            delta[:, :, r:r + s, col:col + s] = _eta(s, x, generator) * random_signs((b, c, 1, 1), x, generator)
    return (x + eps * normalize(delta, "L2")).clamp(0, 1)


def _propose_linf(x: Tensor, x_best: Tensor, eps: float, p: float, generator: torch.Generator | None) -> Tensor:
    """Set one random square of side ≈ √(p·h·w) to x ± ε (one sign per image and channel)."""
    b, c, h, w = x.shape
    s = min(max(round(math.sqrt(p * h * w)), 1), h, w)
    rows, cols = _window(h, w, s, x, generator)
    x_new = x_best.clone()
    x_new[:, :, rows, cols] = (x[:, :, rows, cols] + eps * random_signs((b, c, 1, 1), x, generator)).clamp(0, 1)
    return x_new


def _propose_l2(x: Tensor, x_best: Tensor, eps: float, p: float, generator: torch.Generator | None) -> Tensor:
    """Move the perturbation's mass of two random squares W1, W2 into W1 plus a fresh ±η update,
    keeping ‖δ‖₂ = ε (Andriushchenko et al. 2020, the ℓ2 sampling distribution)."""
    b, c, h, w = x.shape
    s = max(round(math.sqrt(p * h * w)), 3)
    s = min(s + 1 - s % 2, h, w)  # odd side, at most the image
    w1, w2 = _window(h, w, s, x, generator), _window(h, w, s, x, generator)
    delta = x_best - x
    union = torch.zeros_like(x[:1, :1])
    union[..., w1[0], w1[1]] = 1
    union[..., w2[0], w2[1]] = 1
    mass_windows = lp_norm(delta * union, "L2")  # ‖δ on W1 ∪ W2‖₂ per image
    mass_free = (eps**2 - lp_norm(delta, "L2") ** 2).clamp_min(0)  # budget not yet used
    old = delta[:, :, w1[0], w1[1]]
    new = _eta(s, x, generator) * random_signs((b, c, 1, 1), x, generator)
    new = new + old / old.flatten(2).norm(dim=2)[..., None, None].clamp_min(1e-12)
    new = new / new.flatten(2).norm(dim=2)[..., None, None].clamp_min(1e-12)
    new = new * per_sample((mass_free / c + mass_windows**2).sqrt(), x)
    delta[:, :, w2[0], w2[1]] = 0
    delta[:, :, w1[0], w1[1]] = new
    return (x + eps * normalize(delta, "L2")).clamp(0, 1)


def square_attack(
    model: Model,
    x: Tensor,
    y: Tensor,
    *,
    norm: str = "Linf",
    eps: float,
    n_queries: int = 5000,
    p_init: float = 0.8,
    rescale_schedule: bool = False,
    generator: torch.Generator | None = None,
) -> Tensor:
    """Square Attack (Andriushchenko et al., ECCV 2020): random search on square-shaped updates,
    minimising the margin z_y − max_{k≠y} z_k; uses only the model's outputs (no gradients).

    Each point is queried until it is misclassified or has used ``n_queries`` model evaluations
    (the initial point included). The square side follows :func:`square_p_schedule`; the window is
    shared by the batch at each iteration, the signs are drawn per image and channel.

    Args:
        x: images in [0, 1], (B, C, H, W); y: true labels (B,).
    Returns:
        (B, C, H, W) inside the ε-ball ∩ [0, 1] box: the lowest-margin point found (misclassified
        where the attack succeeded).
    """
    check_inputs(x, y, model)
    check_norm_eps(norm, eps)
    check_count("n_queries", n_queries)
    if x.ndim != 4:
        raise KdcollapseError(f"the Square attack needs images (B, C, H, W), got shape {tuple(x.shape)}")
    if not 0 < p_init <= 1:
        raise KdcollapseError(f"p_init must lie in (0, 1], got {p_init!r}")
    init, propose = (_init_linf, _propose_linf) if norm == "Linf" else (_init_l2, _propose_l2)
    with eval_mode(model), torch.no_grad():
        x_best = init(x, eps, generator)
        best = margin(logits_of(model, x_best), y)
        for i in range(n_queries - 1):
            active = (best > 0).nonzero().squeeze(1)
            if active.numel() == 0:
                break
            p = square_p_schedule(i, p_init, n_queries, rescale_schedule)
            x_new = propose(x[active], x_best[active], eps, p, generator)
            m = margin(logits_of(model, x_new), y[active])
            improved = m < best[active]
            x_best[active[improved]] = x_new[improved]
            best[active[improved]] = m[improved]
    return x_best
