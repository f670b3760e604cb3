"""The UFM report of ``kdcollapse geometry ufm``: three experiments of the GNC paper on the UFM.

A. Spherical constraint (eq. 2) vs weight decay (eq. B.1), K = 30, d = 2 (Fig. B.1 c, d).
B. GNC2 at convergence against the temperature, K = 100, d = 10 (the trend of Fig. B.4).
C. Theorem 3.3's three regimes: rho at small temperature against the closed forms.
"""

from __future__ import annotations

import platform
import sys
import time
from pathlib import Path

import torch

from kdcollapse.geometry import softmax_code, softmax_code_optimum
from kdcollapse.experiments.plots import plot_code, plot_curves, plot_sweep
from kdcollapse.experiments.ufm import temperature_continuation, train_ufm

# Sizes of the full run and of --quick (a smoke test of the whole pipeline).
_FULL = {
    "compare": {"K": 30, "d": 2, "n": 2, "gd_steps": 5000, "lbfgs_steps": 3000, "tau": 0.02, "wd_tau": 1.0, "wd": 5e-4},
    "sweep": {"K": 100, "d": 10, "n": 2, "steps": 1000, "temperatures": [1, 0.5, 0.2, 0.1, 0.05, 0.02, 0.01, 0.005]},
    "regimes": {"cases": [(8, 2), (4, 3), (7, 4)], "n": 2, "steps": 500,
                "temperatures": [1, 0.3, 0.1, 0.03, 0.01, 0.003]},
    "code_restarts": 2,
}
_QUICK = {
    "compare": {"K": 8, "d": 2, "n": 2, "gd_steps": 200, "lbfgs_steps": 100, "tau": 0.05, "wd_tau": 1.0, "wd": 5e-4},
    "sweep": {"K": 12, "d": 3, "n": 2, "steps": 100, "temperatures": [1, 0.1, 0.01]},
    "regimes": {"cases": [(5, 2), (3, 2)], "n": 2, "steps": 100, "temperatures": [1, 0.1, 0.01]},
    "code_restarts": 1,
}


def write_ufm_report(out: str | Path, *, quick: bool = False, seed: int = 0) -> Path:
    """Run experiments A-C, write ``ufm.md`` and PNG figures into ``out``; returns the markdown path."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = _QUICK if quick else _FULL
    start = time.perf_counter()
    sections = [_compare(cfg["compare"], out, seed), _sweep(cfg["sweep"], cfg["code_restarts"], out, seed),
                _regimes(cfg["regimes"], out, seed)]
    header = [
        "# Unconstrained features model (GNC paper eq. 2 vs B.1)",
        "",
        f"Command: `kdcollapse geometry ufm --out {out}{' --quick' if quick else ''} --seed {seed}` "
        f"({time.perf_counter() - start:.0f} s on {platform.processor() or platform.machine()}, "
        f"torch {torch.__version__}, Python {sys.version.split()[0]}; one run, deterministic for a seed).",
        "",
        "Full-batch L-BFGS in float64. The spherical UFM minimises tau * log(mean CE) (eq. C.2), which has the",
        "minimisers of the CE of eq. 2 without underflow at small tau. GNC1 = tr(Sigma_W Sigma_B^+)/K,",
        "GNC2 = rho one-vs-rest of the normalised W (exact, certified), GNC3 = mean(1 - w_k^T hbar_k), on",
        "normalised features (Section 2.2).",
        "",
    ]
    path = out / "ufm.md"
    path.write_text("\n".join(header + sum(sections, [])) + "\n")
    return path


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e-3 else f"{x:.5f}"


def _compare(c: dict, out: Path, seed: int) -> list[str]:
    K, d, n = c["K"], c["d"], c["n"]
    runs = {}
    for optimizer, steps in (("gd", c["gd_steps"]), ("lbfgs", c["lbfgs_steps"])):
        for regularization, tau in (("sphere", c["tau"]), ("weight_decay", c["wd_tau"])):
            runs[optimizer, regularization] = train_ufm(
                K, d, n, regularization=regularization, temperature=tau, weight_decay=c["wd"], optimizer=optimizer,
                steps=steps, lr=0.1, log_every=max(1, steps // 50), seed=seed,
            )
    optimum = softmax_code_optimum(K, d)
    plot_curves({f"{r}, {o}": res.history for (o, r), res in runs.items()}, out / "ufm_sphere_vs_wd.png", optimum)
    lines = [
        f"## A. Spherical constraint (eq. 2, tau={c['tau']}) vs weight decay (eq. B.1, lambda={c['wd']}, "
        f"tau={c['wd_tau']}); K={K}, d={d}, n={n}",
        "",
        f"`gd`: the paper's UFM schedule (B.1: plain gradient descent, lr 0.1 divided by 10 every "
        f"{c['gd_steps'] // 5} iterations, {c['gd_steps']} iterations); `lbfgs`: {c['lbfgs_steps']} L-BFGS "
        "iterations (converged). Classifier lengths: max/min of the norms of the w_k (1 under the spherical constraint).",
        "",
        _row("UFM", "optimizer", "loss", "GNC1", "GNC2", "GNC3", "max/min norm of w_k", "softmax-code optimum"),
        _row(*["---"] * 8),
    ]
    figures = []
    for (optimizer, regularization), res in runs.items():
        f = res.final
        norms = res.W.norm(dim=1)
        lines.append(_row(regularization, optimizer, _fmt(f["loss"]), _fmt(f["gnc1"]), _fmt(f["gnc2"]), _fmt(f["gnc3"]),
                          f"{(norms.max() / norms.min()).item():.3f}", "-" if optimum is None else _fmt(optimum)))
        if d == 2:
            means = res.H.view(K, n, d).mean(1)
            scale = max(res.W.norm(dim=1).max().item(), means.norm(dim=1).max().item())
            path = plot_code(res.W / res.W.norm(dim=1).max(), out / f"ufm_{regularization}_{optimizer}_K{K}_d2.png",
                             f"UFM {regularization}, {optimizer}", features=means / scale, feature_label="class means")
            figures.append(f"![{regularization} {optimizer}]({path.name})")
    return lines + ["", "![curves](ufm_sphere_vs_wd.png)", "", *figures, ""]


def _sweep(c: dict, restarts: int, out: Path, seed: int) -> list[str]:
    K, d, n = c["K"], c["d"], c["n"]
    results = temperature_continuation(K, d, n, c["temperatures"], steps=c["steps"], seed=seed)
    code = softmax_code(K, d, restarts=restarts, seed=seed)
    values = [r.final["gnc2"] for r in results]
    plot_sweep(c["temperatures"], values, out / "ufm_temperature_sweep.png", code.one_vs_rest)
    lines = [
        f"## B. GNC2 at convergence against the temperature (K={K}, d={d}, n={n})",
        "",
        "Each temperature warm-starts from the previous one (continuation). Softmax code found by",
        f"`softmax_code({K}, {d}, restarts={restarts})`: rho = {code.one_vs_rest:.5f}.",
        "",
        _row("tau", "CE loss (eq. 2)", "GNC1", "GNC2", "GNC3", "GNC2 / softmax code"),
        _row(*["---"] * 6),
    ]
    for tau, r in zip(c["temperatures"], results):
        f = r.final
        lines.append(_row(tau, _fmt(f["loss"]), _fmt(f["gnc1"]), _fmt(f["gnc2"]), _fmt(f["gnc3"]),
                          f"{f['gnc2'] / code.one_vs_rest:.3f}"))
    return lines + ["", "![sweep](ufm_temperature_sweep.png)", ""]


def _regimes(c: dict, out: Path, seed: int) -> list[str]:
    lines = [
        "## C. Theorem 3.3's regimes: the spherical UFM at small temperature",
        "",
        f"Temperatures {c['temperatures']} by continuation, n={c['n']}.",
        "",
        _row("K", "d", "regime", "GNC1", "GNC2", "closed form", "GNC2 - closed form", "GNC3"),
        _row(*["---"] * 8),
    ]
    for K, d in c["cases"]:
        regime = "K <= d+1 (simplex ETF)" if K <= d + 1 else ("d = 2 (circle)" if d == 2 else "d+1 < K <= 2d (cross-polytope)")
        f = temperature_continuation(K, d, c["n"], c["temperatures"], steps=c["steps"], seed=seed)[-1].final
        exact = softmax_code_optimum(K, d)
        lines.append(_row(K, d, regime, _fmt(f["gnc1"]), f"{f['gnc2']:.6f}", f"{exact:.6f}",
                          f"{f['gnc2'] - exact:.2e}", _fmt(f["gnc3"])))
    closed = {"circle": "1 - cos(2 pi/K)", "ETF": "K/(K-1)", "cross": "1"}
    return lines + ["", "Closed forms: " + ", ".join(f"{k}: {v}" for k, v in closed.items()) + ".", ""]

