"""Figures: codes on the circle / sphere, UFM configurations and GNC curves (matplotlib, Agg backend)."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from torch import Tensor

from kdcollapse._optional import pyplot as plt
from kdcollapse.errors import KdcollapseError


def plot_code(
    W: Tensor, path: str | Path, title: str = "", features: Tensor | None = None, feature_label: str = "features"
) -> Path:
    """Draw the rows of W (K, d) as arrows (d = 2, with the unit circle) or points on the sphere (d = 3).

    Rows are drawn as given (codes have unit rows; scale other matrices to norm <= 1); pairs at the
    minimal distance are joined; ``features`` (d = 2 only) are drawn as dots.
    """
    W = W.detach().cpu().double().numpy()
    d = W.shape[1]
    gaps = np.linalg.norm(W[:, None] - W[None], axis=2) + np.eye(len(W)) * 9
    contacts = np.argwhere(np.triu(gaps <= gaps.min() * (1 + 1e-4)))  # pairs at the minimal distance
    if d not in (2, 3):
        raise KdcollapseError(f"can only draw codes in 2 or 3 dimensions, got d={d}")
    fig = plt.figure(figsize=(5, 5))
    if d == 2:
        ax = fig.add_subplot()
        t = np.linspace(0, 2 * math.pi, 400)
        ax.plot(np.cos(t), np.sin(t), color="0.8", lw=1)
        for k, w in enumerate(W):
            ax.annotate("", xy=w, xytext=(0, 0), arrowprops={"arrowstyle": "->", "color": f"C{k % 10}"})
        for i, j in contacts:
            ax.plot(*W[[i, j]].T, color="0.5", lw=0.8, ls=":")
        if features is not None:
            H = features.detach().cpu().double().numpy()
            ax.scatter(H[:, 0], H[:, 1], s=8, c="k", alpha=0.5, label=feature_label)
            ax.legend(loc="lower right")
        ax.set_aspect("equal")
        ax.set_xlim(-1.15, 1.15)
        ax.set_ylim(-1.15, 1.15)
    else:
        ax = fig.add_subplot(projection="3d")
        u, v = np.mgrid[0 : 2 * np.pi : 30j, 0 : np.pi : 15j]
        ax.plot_wireframe(np.cos(u) * np.sin(v), np.sin(u) * np.sin(v), np.cos(v), color="0.85", lw=0.5)
        ax.scatter(W[:, 0], W[:, 1], W[:, 2], s=40, c=[f"C{k % 10}" for k in range(len(W))], depthshade=False)
        for i, j in contacts:
            ax.plot(*W[[i, j]].T, color="0.3", lw=1)
        ax.set_box_aspect((1, 1, 1))
    ax.set_title(title)
    return _save(fig, path)


def plot_curves(series: dict[str, list[dict]], path: str | Path, optimum: float | None = None) -> Path:
    """GNC1 / GNC2 / GNC3 against the step for several labelled UFM histories."""
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for label, history in series.items():
        steps = [h["step"] for h in history]
        for ax, name in zip(axes, ("gnc1", "gnc2", "gnc3")):
            ax.plot(steps, [max(h[name], 1e-16) if name != "gnc2" else h[name] for h in history], label=label)
    for ax, name in zip(axes, ("GNC1 (variability)", "GNC2 (rho one-vs-rest)", "GNC3 (self-duality)")):
        ax.set_title(name)
        ax.set_xlabel("iteration")
    axes[0].set_yscale("log")
    axes[2].set_yscale("log")
    if optimum is not None:
        axes[1].axhline(optimum, color="k", ls="--", lw=1, label="softmax code")
    axes[1].legend()
    return _save(fig, path)


def plot_sweep(temperatures: list[float], values: list[float], path: str | Path, optimum: float | None) -> Path:
    """GNC2 at convergence against the temperature (log axis), with the softmax-code optimum."""
    fig, ax = plt.subplots(figsize=(5, 3.6))
    ax.plot(temperatures, values, "o-", label="UFM (eq. 2) at convergence")
    if optimum is not None:
        ax.axhline(optimum, color="k", ls="--", lw=1, label="softmax code")
    ax.set_xscale("log")
    ax.invert_xaxis()
    ax.set_xlabel("temperature tau")
    ax.set_ylabel("GNC2 = rho one-vs-rest(W)")
    ax.legend()
    return _save(fig, path)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
