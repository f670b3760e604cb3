"""Clean-vs-robust fronts of TRADES and IKL-AT (the runs of ``study.yaml``): per setting and seed the clean accuracy and PGD-20
accuracy on all 10,000 test images and AutoAttack standard on the first N; a figure of both fronts; and, per
IKL-AT setting, its robust accuracy against TRADES' front at the same clean accuracy (seed by seed: the
TRADES points of that seed, linearly interpolated between neighbouring beta), with a paired t-test.

    PYTHONPATH=src python results/adversarial/fronts/summarise.py RUNS results/adversarial/fronts
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import matplotlib
import numpy as np

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kdcollapse.report import markdown_table, mean_std, paired_t_test  # noqa: E402
from kdcollapse.study import load_study  # noqa: E402

PGD, AA = "pgd-20 Linf eps=0.1 last", "autoattack-standard Linf eps=0.1 last"
ROBUST = {"pgd20": "PGD-20 (10,000)", "aa": "AutoAttack standard"}
ATTACKS = ("apgd-ce", "apgd-t", "fab-t", "square")  # AutoAttack standard's stages


def settings() -> list[str]:
    """Setting names in the study file's order (the folder of each run, above seed<N>)."""
    study = load_study(Path(__file__).parent / "study.yaml")
    return list(dict.fromkeys(name.split("/")[0] for name in study.runs))


def load(run: Path) -> dict | None:
    """Clean/PGD-20 accuracy on all test images and clean/AutoAttack on the first N (%), of an evaluated run."""
    path = run / "robust_eval.json"
    if not path.is_file():
        return None
    evals = json.loads(path.read_text())
    if PGD not in evals:
        return None
    out = {"clean": 100 * evals[PGD]["clean_accuracy"], "pgd20": 100 * evals[PGD]["robust_accuracy"]}
    if AA in evals:
        out |= {"clean_aa": 100 * evals[AA]["clean_accuracy"], "aa": 100 * evals[AA]["robust_accuracy"],
                "aa_images": int(re.search(r"first (\d+)", evals[AA]["examples"]).group(1)),
                "aa_broken": {stage["attack"]: stage["broken"] for stage in evals[AA]["stages"]}}
    return out


def front_at(points: list[tuple[float, float]], clean: float) -> float | None:
    """TRADES' robust accuracy at ``clean`` on the piecewise-linear front through ``points`` (clean, robust);
    None outside the clean range the points span (no extrapolation)."""
    xs, ys = zip(*sorted(points))
    if not xs[0] <= clean <= xs[-1]:
        return None
    return float(np.interp(clean, xs, ys))


def matched(runs: dict, trades: list[str], name: str, key: str) -> list[str] | None:
    """The row comparing IKL-AT setting ``name`` with TRADES' front at its clean accuracy, over the seeds both
    have (robust metric ``key``)."""
    diffs = {}
    for seed, r in runs[name].items():
        points = [(runs[t][seed]["clean"], runs[t][seed][key]) for t in trades
                  if seed in runs[t] and key in runs[t][seed]]
        if key in r and len(points) >= 2 and (at := front_at(points, r["clean"])) is not None:
            diffs[seed] = (r[key], at)
    if len(diffs) < 2:
        return None
    seeds = sorted(diffs)
    d, p = paired_t_test([diffs[s][0] for s in seeds], [diffs[s][1] for s in seeds])
    per_seed = ", ".join(f"{diffs[s][0] - diffs[s][1]:+.2f}" for s in seeds)
    p_text = f"{p:.3f}" if p >= 0.001 else "< 0.001"
    return [name, ROBUST[key], ",".join(map(str, seeds)), per_seed, f"{d:+.2f}", p_text]


def model_name(root: Path) -> str:
    """The model the runs trained (from the first run's ``config.yaml``)."""
    config = next(root.glob("*/seed*/config.yaml"), None)
    match = config and re.search(r"^model:\n  name: (\S+)", config.read_text(), flags=re.M)
    return match.group(1) if match else "?"


def both_higher(runs: dict, a: str, b: str) -> bool:
    """Whether setting ``a`` has higher mean clean and mean AutoAttack accuracy than ``b`` over the seeds both
    have evaluated with AutoAttack."""
    seeds = [s for s in runs[a] if s in runs[b] and "aa" in runs[a][s] and "aa" in runs[b][s]]
    return bool(seeds) and all(np.mean([runs[a][s][k] for s in seeds]) > np.mean([runs[b][s][k] for s in seeds])
                               for k in ("clean", "aa"))


def plot(runs: dict, names: list[str], key: str, model: str, path: Path) -> None:
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for method, color in (("trades", "tab:blue"), ("ikl_at", "tab:red")):
        points = []
        for name in (n for n in names if n.startswith(method + "_")):
            done = [r for r in runs[name].values() if key in r]
            if not done:
                continue
            x, y = np.mean([r["clean"] for r in done]), np.mean([r[key] for r in done])
            xe = np.std([r["clean"] for r in done], ddof=1) if len(done) > 1 else 0
            ye = np.std([r[key] for r in done], ddof=1) if len(done) > 1 else 0
            ax.errorbar(x, y, xerr=xe, yerr=ye, fmt="o", color=color, capsize=2, markersize=4)
            ax.annotate(name.split("_", 1 + (method == "ikl_at"))[-1], (x, y), fontsize=7,
                        xytext=(3, 3), textcoords="offset points")
            points.append((x, y))
        if points and method == "trades":  # a curve over its one weight
            ax.plot(*zip(*sorted(points)), color=color, alpha=0.5, label="TRADES (β)")
        elif points:  # a grid over two weights: points only
            ax.plot([], [], "o", color=color, label="IKL-AT (MSE, CE weights)")
    ax.set_xlabel("clean accuracy (%), 10,000 test images")
    ax.set_ylabel(f"robust accuracy (%), {ROBUST[key]}")
    ax.set_title(f"Fashion-MNIST, {model}, L∞ ε = 0.1: mean ± std over seeds", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(root: Path, out: Path) -> None:
    names = settings()
    runs = {n: {int(p.name[4:]): r for p in sorted((root / n).glob("seed*")) if (r := load(p)) is not None}
            for n in names}
    columns = ("clean", "pgd20", "clean_aa", "aa")
    rows = [[n, ",".join(map(str, runs[n])),
             *(mean_std(v) if (v := [r[c] for r in runs[n].values() if c in r]) else "–" for c in columns)]
            for n in names if runs[n]]
    aa_images = sorted({r["aa_images"] for rs in runs.values() for r in rs.values() if "aa_images" in r})
    first = f"first {'/'.join(map(str, aa_images)) or 'N'}"
    text = ["### Accuracy (%), mean ± std over seeds\n\n" + markdown_table(
        ["setting", "seeds", "clean (10,000)", "PGD-20 (10,000)", f"clean ({first})", f"AutoAttack ({first})"], rows)]
    every = [[n, str(seed), *(f"{r[c]:.2f}" if c in r else "–" for c in columns)]
             for n in names for seed, r in runs[n].items()]
    text.append("### Every run (%)\n\n" + markdown_table(
        ["setting", "seed", "clean (10,000)", "PGD-20 (10,000)", f"clean ({first})", f"AutoAttack ({first})"], every))
    trades = [n for n in names if n.startswith("trades_")]
    tests = [row for n in names if n.startswith("ikl_at_") for key in ROBUST if (row := matched(runs, trades, n, key))]
    if tests:
        text.append("### IKL-AT against TRADES' front at the same clean accuracy (robust accuracy, pp)\n\n"
                    + markdown_table(["IKL-AT setting", "robust accuracy", "seeds", "per seed (pp)", "mean (pp)",
                                      "paired t-test p"], tests))
    stages = [[n, *(mean_std([r["aa_broken"].get(a, 0) for r in done], 1) for a in ATTACKS)]
              for n in names if (done := [r for r in runs[n].values() if "aa_broken" in r])]
    if stages:
        text.append(f"### Images each AutoAttack stage broke ({first}; mean ± std over seeds): what FAB-T and Square "
                    "find after APGD is the check against gradient masking\n\n"
                    + markdown_table(["setting", *ATTACKS], stages))
    beaten = [[n, ", ".join(f"β = {t.removeprefix('trades_b')}" for t in trades if both_higher(runs, n, t)) or "none"]
              for n in names if n.startswith("ikl_at_") and runs[n]]
    if beaten:
        text.append("### TRADES settings that an IKL-AT setting beats on both clean (10,000) and AutoAttack accuracy "
                    "(means over the seeds both have)\n\n" + markdown_table(["IKL-AT setting", "TRADES"], beaten))
    out.mkdir(parents=True, exist_ok=True)
    for key in ROBUST:
        if any(key in r for rs in runs.values() for r in rs.values()):
            plot(runs, names, key, model_name(root), out / f"front_{key}.png")
    (out / "tables.md").write_text("\n\n".join(text) + "\n")
    (out / "summary.json").write_text(json.dumps(runs, indent=1) + "\n")
    print("\n\n".join(text))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]))
