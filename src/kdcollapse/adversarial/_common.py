"""The threat model every attack shares: the ε-ball around x intersected with the [0, 1] box.

Models are callables on [0, 1] inputs returning (B, K) logits (put the dataset normalisation inside the
model, e.g. with :class:`Normalized`). Every attack runs the model in eval mode, restores each module's
previous mode afterwards (also on exceptions) and takes gradients with respect to the input only, so
parameters never receive a ``.grad``.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import torch
from torch import Tensor, nn

from kdcollapse.distributed import autocast, resolve_precision
from kdcollapse.errors import KdcollapseError, unknown_choice

NORMS = ("Linf", "L2")
# Float32 rounding of x + δ can exceed ε by a few ulps; checks of the ball allow this much.
BALL_TOLERANCE = 1e-5

Model = Callable[[Tensor], Tensor]
Objective = Callable[[Tensor], Tensor]  # logits (B, K) -> per-sample loss (B,) to maximise


class Normalized(nn.Module):
    """``model((x - mean) / std)``: lets attacks work on [0, 1] inputs of a model trained on
    standardised ones. ``mean`` and ``std`` are per channel (dimension 1 of the input)."""

    def __init__(self, model: nn.Module, mean: Sequence[float] | Tensor, std: Sequence[float] | Tensor):
        super().__init__()
        mean = torch.as_tensor(mean, dtype=torch.float32).flatten()
        std = torch.as_tensor(std, dtype=torch.float32).flatten()
        if mean.shape != std.shape:
            raise KdcollapseError(f"mean has {mean.numel()} channels but std has {std.numel()}")
        if not bool((std > 0).all()) or not bool(torch.isfinite(mean).all()):
            raise KdcollapseError(f"std must be positive and mean finite, got mean={mean.tolist()} std={std.tolist()}")
        self.model = model
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)

    def forward(self, x: Tensor) -> Tensor:
        shape = (1, -1) + (1,) * (x.ndim - 2)
        return self.model((x - self.mean.view(shape)) / self.std.view(shape))


class SearchModel(nn.Module):
    """The model attacks search with: ``model`` under autocast to ``dtype`` (and/or fed channels-last
    batches), returning float32 logits. Only the search runs in it; whether an input fools the model is
    always decided by the model itself in float32 (:func:`evaluate_attacks`), so a faster search can miss
    an adversarial example but never reports one that is not."""

    def __init__(self, model: nn.Module, dtype: torch.dtype | None, channels_last: bool):
        super().__init__()
        self.model, self.dtype, self.channels_last = model, dtype, channels_last

    def forward(self, x: Tensor) -> Tensor:
        if self.channels_last and x.dim() == 4:
            x = x.contiguous(memory_format=torch.channels_last)
        with autocast(x.device, self.dtype):
            return self.model(x).float()


def search_model(model: Model, x: Tensor, precision: str = "off", channels_last: bool = False) -> Model:
    """``model`` itself for a float32 search, else its :class:`SearchModel` (``precision``: off | bf16 |
    fp16, checked against the device of ``x``); channels-last also converts the model's weights."""
    dtype = resolve_precision(precision, x.device, option="precision")
    if dtype is None and not channels_last:
        return model
    if not isinstance(model, nn.Module):
        raise KdcollapseError("a lower precision or channels-last search needs an nn.Module model")
    if channels_last and x.dim() == 4:
        model.to(memory_format=torch.channels_last)
    return SearchModel(model, dtype, channels_last)


@contextmanager
def eval_mode(model: Model) -> Iterator[None]:
    """Put every submodule in eval mode; restore each one's own previous mode on exit."""
    modules = list(model.modules()) if isinstance(model, nn.Module) else []
    modes = [m.training for m in modules]
    try:
        if modules:
            model.eval()
        yield
    finally:
        for m, mode in zip(modules, modes):
            m.training = mode


def check_norm_eps(norm: str, eps: float) -> None:
    if norm not in NORMS:
        raise KdcollapseError(unknown_choice("norm", norm, NORMS))
    if not isinstance(eps, numbers.Real) or isinstance(eps, bool) or not math.isfinite(eps) or eps <= 0:
        raise KdcollapseError(f"eps must be a positive finite number, got {eps!r}")


def parse_eps(value: float | str, *, norm: str = "Linf", name: str = "eps") -> float:
    """A radius given as a number or a fraction of two numbers, e.g. ``0.1`` or ``"8/255"``.

    Refuses anything that is not positive and finite, and an ℓ∞ radius ≥ 1 (it covers the whole
    [0, 1] box: ``8`` is almost always meant as ``8/255``). ``name`` is used in the error message.
    """
    text = str(value).strip()
    numerator, slash, denominator = text.partition("/")
    try:
        eps = float(numerator) / float(denominator) if slash else float(text)
    except (ValueError, ZeroDivisionError):
        raise KdcollapseError(f"{name} must be a number or a fraction such as 8/255, got {value!r}") from None
    if isinstance(value, bool) or not math.isfinite(eps) or eps <= 0:
        raise KdcollapseError(f"{name} must be positive and finite, got {value!r}")
    if norm == "Linf" and eps >= 1:
        raise KdcollapseError(f"{name}={value!r} is an L-inf radius >= 1, which covers the whole [0, 1] box; "
                              f"inputs are in [0, 1] units (did you mean {eps:g}/255?)")
    return eps


def check_count(name: str, value: int, minimum: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
        raise KdcollapseError(f"{name} must be an integer >= {minimum}, got {value!r}")


def check_inputs(x: Tensor, y: Tensor | None = None, model: Model | None = None) -> None:
    """Inputs: a float (B, ...) tensor in [0, 1] without NaNs; labels: int64 (B,), in ``0..K-1`` for ``model``'s
    K classes when ``model`` is given (one forward pass of one input)."""
    if not isinstance(x, Tensor) or not x.is_floating_point() or x.ndim < 2:
        raise KdcollapseError(
            f"x must be a float tensor of shape (B, ...), got {type(x).__name__} "
            f"{getattr(x, 'dtype', '')} {tuple(getattr(x, 'shape', ()))}"
        )
    if x.shape[0] == 0:
        raise KdcollapseError("x is an empty batch")
    if torch.isnan(x).any():
        raise KdcollapseError("x contains NaN")
    if x.min() < 0 or x.max() > 1:
        raise KdcollapseError(
            f"x must lie in [0, 1] (found [{x.min().item():.3g}, {x.max().item():.3g}]); attacks work on "
            "unnormalised inputs: wrap the model in Normalized(model, mean, std) instead"
        )
    if y is not None:
        if not isinstance(y, Tensor) or y.dtype != torch.int64 or y.shape != x.shape[:1]:
            raise KdcollapseError(
                f"y must be an int64 tensor of shape ({x.shape[0]},), got "
                f"{getattr(y, 'dtype', type(y).__name__)} {tuple(getattr(y, 'shape', ()))}"
            )
        k = num_classes(model, x) if model is not None else None
        if y.min() < 0 or (k is not None and y.max() >= k):
            bad = y[(y < 0) | (y >= (k if k is not None else y.max() + 1))][0].item()
            raise KdcollapseError(f"y holds label {bad}; labels must be class indices "
                                  f"{'0..' + str(k - 1) if k is not None else '>= 0'}")


def logits_of(model: Model, x: Tensor) -> Tensor:
    """``model(x)``, checked to be (B, K) logits."""
    logits = model(x)
    if not isinstance(logits, Tensor) or logits.ndim != 2 or logits.shape[0] != x.shape[0]:
        raise KdcollapseError(
            f"the model must return (B, K) logits for a batch of {x.shape[0]}, got "
            f"{tuple(logits.shape) if isinstance(logits, Tensor) else type(logits).__name__}"
        )
    return logits


def num_classes(model: Model, x: Tensor) -> int:
    """K, from the logits of the first input."""
    with eval_mode(model), torch.no_grad():
        return logits_of(model, x[:1]).shape[1]


@torch.no_grad()
def predict(model: Model, x: Tensor) -> Tensor:
    return logits_of(model, x).argmax(1)


def loss_and_grad(model: Model, x_adv: Tensor, objective: Objective) -> tuple[Tensor, Tensor, Tensor]:
    """Per-sample objective (B,), its gradient with respect to the input, and the logits.

    ``torch.autograd.grad`` with the input as the only target: no parameter gradient is accumulated.
    """
    with torch.enable_grad():
        x_adv = x_adv.detach().requires_grad_(True)
        logits = logits_of(model, x_adv)
        loss = objective(logits)
        (grad,) = torch.autograd.grad(loss.sum(), x_adv)
    return loss.detach(), grad.detach(), logits.detach()


def per_sample(v: Tensor, like: Tensor) -> Tensor:
    """A (B,) tensor viewed to broadcast against ``like`` of shape (B, ...)."""
    return v.view(-1, *([1] * (like.ndim - 1)))


def lp_norm(delta: Tensor, norm: str) -> Tensor:
    """Per-sample ℓ∞ or ℓ2 norm (B,) of a (B, ...) tensor."""
    flat = delta.flatten(1)
    return flat.abs().amax(1) if norm == "Linf" else flat.norm(dim=1)


def normalize(v: Tensor, norm: str) -> Tensor:
    """Unit-norm direction per sample (zero stays zero)."""
    return v / per_sample(lp_norm(v, norm) + 1e-12, v)


def steepest_ascent(grad: Tensor, norm: str) -> Tensor:
    """The unit step of steepest ascent for the norm: sign(∇) for ℓ∞, ∇/‖∇‖₂ for ℓ2."""
    return grad.sign() if norm == "Linf" else normalize(grad, "L2")


def project(x_adv: Tensor, x: Tensor, norm: str, eps: float) -> Tensor:
    """Map ``x_adv`` into {z : ‖z − x‖ ≤ ε} ∩ [0, 1]^d.

    ℓ∞: exact Euclidean projection (both sets are boxes). ℓ2: radial projection onto the ball, then
    clipping to the box; clipping moves each coordinate towards x (which lies in the box), so the result
    stays inside the ball.
    """
    delta = x_adv - x
    if norm == "Linf":
        delta = delta.clamp(-eps, eps)
    else:
        delta = delta * per_sample((eps / (lp_norm(delta, "L2") + 1e-12)).clamp(max=1.0), delta)
    return (x + delta).clamp(0.0, 1.0)


def in_threat_model(x_adv: Tensor, x: Tensor, norm: str, eps: float) -> Tensor:
    """(B,) bool: inside the ε-ball (up to float rounding) and inside the [0, 1] box."""
    in_box = ((x_adv >= 0) & (x_adv <= 1)).flatten(1).all(1)
    return in_box & (lp_norm(x_adv - x, norm) <= eps + BALL_TOLERANCE)


def uniform(shape: Sequence[int], like: Tensor, generator: torch.Generator | None) -> Tensor:
    """U[0, 1) samples on ``like``'s device, drawn from ``generator`` (on whatever device it lives)."""
    device = generator.device if generator is not None else like.device
    return torch.rand(tuple(shape), generator=generator, device=device, dtype=like.dtype).to(like.device)


def gaussian(shape: Sequence[int], like: Tensor, generator: torch.Generator | None) -> Tensor:
    device = generator.device if generator is not None else like.device
    return torch.randn(tuple(shape), generator=generator, device=device, dtype=like.dtype).to(like.device)


def random_signs(shape: Sequence[int], like: Tensor, generator: torch.Generator | None) -> Tensor:
    return torch.where(uniform(shape, like, generator) < 0.5, -1.0, 1.0).to(like.dtype)


def random_init(x: Tensor, norm: str, eps: float, generator: torch.Generator | None) -> Tensor:
    """A random point of the threat model: ℓ∞ uniform in the cube, ℓ2 uniform on the sphere of
    radius ε (the starting points of PGD, Madry et al. 2018, and APGD, Croce & Hein 2020)."""
    if norm == "Linf":
        delta = eps * (2 * uniform(x.shape, x, generator) - 1)
    else:
        delta = eps * normalize(gaussian(x.shape, x, generator), "L2")
    return (x + delta).clamp(0.0, 1.0)


def attack_in_rounds(
    model: Model, x: Tensor, y: Tensor, n_rounds: int, attack_round: Callable[[int, Tensor], Tensor]
) -> Tensor:
    """Run ``attack_round(r, idx) -> candidates for x[idx]`` for r = 0..n_rounds-1, each round only on
    the points still classified correctly (AutoAttack's restarts and target classes).

    A point keeps the first candidate that fools the model; a point never fooled keeps the candidate of
    the last round that attacked it (for APGD its highest-loss point, for FAB the clean input).
    """
    x_adv = x.clone()
    robust = predict(model, x) == y
    for r in range(n_rounds):
        idx = robust.nonzero().squeeze(1)
        if idx.numel() == 0:
            break
        candidates = attack_round(r, idx)
        x_adv[idx] = candidates
        robust[idx] = predict(model, candidates) == y[idx]
    return x_adv
