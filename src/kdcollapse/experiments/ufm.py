"""Unconstrained features model (UFM) experiments of the GNC paper (eq. 2 and eq. B.1).

The UFM treats the last-layer features H (n per class) and the classifier W as free variables:

* ``"sphere"`` (eq. 2): min CE(W^T h / tau) over unit rows of W and H, parametrised as normalised
  free vectors;
* ``"weight_decay"`` (eq. B.1): min CE(W^T h / tau) + lambda/2 (||W||_F^2 + ||H||_F^2), unconstrained.

``optimizer="lbfgs"`` (default) runs full-batch L-BFGS, which reaches the minimiser; for the sphere it
minimises tau * log(mean CE), the paper's L_0 of eq. C.2, which has the same minimisers as the CE but
does not underflow when the CE is below 1e-300 at small tau. ``optimizer="gd"`` is the paper's plain
gradient descent on the CE itself (B.1: lr 0.1, divided by 10 every fifth of the run).

GNC1-3 (Section 2.2) come from :mod:`kdcollapse.metrics`, the same code that measures trained networks;
GNC2 is rho_one-vs-rest of the normalised W, computed exactly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError, unknown_choice
from kdcollapse.geometry import check_sizes

REGULARIZATIONS = ("sphere", "weight_decay")
OPTIMIZERS = ("lbfgs", "gd")


@dataclass
class UFMResult:
    """A trained UFM: W (K, d), H (K*n, d) (rows of class k are k*n ... k*n+n-1), and its history.

    ``history`` holds one dict per logged step: ``step``, ``loss`` (the loss of eq. 2 or B.1) and
    ``gnc1``, ``gnc2``, ``gnc3``.
    """

    W: Tensor
    H: Tensor
    labels: Tensor
    regularization: str
    temperature: float
    history: list[dict] = field(default_factory=list)

    @property
    def final(self) -> dict:
        return self.history[-1]


def _gnc_metrics(W: Tensor, H: Tensor, labels: Tensor, num_classes: int) -> dict[str, float]:
    """GNC1, GNC2, GNC3 (GNC Section 2.2) of features H with classifier W, from :mod:`kdcollapse.metrics`."""
    from kdcollapse.metrics.functional import collapse_metrics_from_features  # scipy, the metrics: import on use

    metrics = collapse_metrics_from_features(H.detach(), labels, num_classes, W.detach())
    return {name: metrics[name].item() for name in ("gnc1", "gnc2", "gnc3")}


def train_ufm(
    num_classes: int,
    dim: int,
    samples_per_class: int = 2,
    *,
    regularization: str = "sphere",
    temperature: float = 0.1,
    weight_decay: float = 5e-4,
    optimizer: str = "lbfgs",
    steps: int = 1000,
    lr: float = 0.1,
    log_every: int = 50,
    seed: int = 0,
    init: UFMResult | None = None,
) -> UFMResult:
    """Train the UFM of GNC eq. 2 (``"sphere"``) or eq. B.1 (``"weight_decay"``), logging GNC1-3.

    Args:
        num_classes, dim, samples_per_class: K, d and n (balanced classes).
        temperature: tau dividing the logits (eq. 1).
        weight_decay: lambda of eq. B.1 (``"weight_decay"`` only).
        optimizer: ``"lbfgs"`` (full batch, to convergence) or ``"gd"`` (plain gradient descent).
        steps: optimiser iterations; lr: learning rate of ``"gd"``.
        log_every: iterations between history entries.
        seed: seeds the Gaussian initialisation.
        init: warm start from a previous result (temperature continuation).
    """
    check_sizes(num_classes, dim)
    if regularization not in REGULARIZATIONS:
        raise KdcollapseError(unknown_choice("regularization", regularization, REGULARIZATIONS))
    if optimizer not in OPTIMIZERS:
        raise KdcollapseError(unknown_choice("optimizer", optimizer, OPTIMIZERS))
    if not (temperature > 0 and samples_per_class >= 1 and steps >= 1 and log_every >= 1):
        raise KdcollapseError(
            f"need temperature > 0, samples_per_class >= 1, steps >= 1, log_every >= 1; got {temperature}, "
            f"{samples_per_class}, {steps}, {log_every}"
        )
    K, n = num_classes, samples_per_class
    labels = torch.arange(K).repeat_interleave(n)
    if init is None:
        generator = torch.Generator().manual_seed(seed)
        V = torch.randn(K, dim, generator=generator, dtype=torch.float64)
        U = torch.randn(K * n, dim, generator=generator, dtype=torch.float64)
    else:
        V, U = init.W.clone(), init.H.clone()
    V.requires_grad_()
    U.requires_grad_()

    def loss_fn() -> Tensor:
        """The loss of eq. 2 / B.1 (``"gd"``), or its monotone transform tau * log(loss) (``"lbfgs"``)."""
        if regularization == "weight_decay":
            ce = F.cross_entropy(U @ V.T / temperature, labels)
            return ce + weight_decay / 2 * (V.square().sum() + U.square().sum())
        logits = F.normalize(U, dim=1) @ F.normalize(V, dim=1).T / temperature
        if optimizer == "gd":
            return F.cross_entropy(logits, labels)
        return temperature * _log_mean_cross_entropy(logits, labels)

    def paper_loss(value: float) -> float:
        return math.exp(value / temperature) if regularization == "sphere" and optimizer == "lbfgs" else value

    history = []
    step = _lbfgs([V, U], loss_fn) if optimizer == "lbfgs" else _gradient_descent([V, U], loss_fn, steps, lr)
    for done in range(0, steps, log_every):
        chunk = min(log_every, steps - done)
        loss = step(done, chunk)
        W, H = V.detach(), U.detach()
        history.append({"step": done + chunk, "loss": paper_loss(loss), **_gnc_metrics(W, H, labels, K)})
    if regularization == "sphere":
        W, H = F.normalize(W, dim=1), F.normalize(H, dim=1)
    return UFMResult(W.clone(), H.clone(), labels, regularization, temperature, history)


def _log_mean_cross_entropy(logits: Tensor, labels: Tensor) -> Tensor:
    """log(mean_i CE_i) computed without underflow: CE_i = softplus(LSE_{j != y_i}(z_ij - z_iy_i))."""
    margins = logits - logits.gather(1, labels[:, None])
    margins = margins.scatter(1, labels[:, None], -math.inf)
    a = torch.logsumexp(margins, dim=1)
    log_ce = torch.where(a < -30, a, torch.log(F.softplus(a.clamp_min(-30))))  # log softplus(a) ~ a there
    return torch.logsumexp(log_ce, 0) - math.log(len(labels))


def _lbfgs(params: list[Tensor], loss_fn):
    """A stepper running L-BFGS for a number of iterations; its curvature history persists across calls."""
    optimizer = torch.optim.LBFGS(
        params, history_size=50, tolerance_grad=1e-12, tolerance_change=1e-15, line_search_fn="strong_wolfe"
    )

    def closure() -> Tensor:
        optimizer.zero_grad()
        loss = loss_fn()
        loss.backward()
        return loss

    def step(start: int, iterations: int) -> float:
        optimizer.param_groups[0]["max_iter"] = iterations
        optimizer.param_groups[0]["max_eval"] = iterations * 5 // 4
        optimizer.step(closure)
        with torch.no_grad():
            return loss_fn().item()

    return step


def _gradient_descent(params: list[Tensor], loss_fn, total: int, lr: float):
    """A stepper running plain gradient descent, lr divided by 10 at every fifth of the run (GNC B.1)."""

    def step(start: int, iterations: int) -> float:
        for i in range(start, start + iterations):
            loss = loss_fn()
            grads = torch.autograd.grad(loss, params)
            with torch.no_grad():
                for p, g in zip(params, grads):
                    p -= lr * 0.1 ** (5 * i // total) * g
        return loss.item()

    return step


def temperature_continuation(
    num_classes: int,
    dim: int,
    samples_per_class: int,
    temperatures: list[float],
    *,
    steps: int = 1000,
    seed: int = 0,
) -> list[UFMResult]:
    """Sphere-constrained UFM (eq. 2) solved at each temperature in turn, each warm-started from the last."""
    results, previous = [], None
    for tau in temperatures:
        previous = train_ufm(
            num_classes, dim, samples_per_class, temperature=tau, steps=steps, log_every=steps, seed=seed, init=previous
        )
        results.append(previous)
    return results
