from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def plot_curves(runs: Mapping[str, Sequence[dict]], keys: Sequence[str], path: str | Path,
                title: str | None = None) -> Path:
    """One panel per metric key, one line per run; records are ``metrics.jsonl`` rows (with ``epoch``).

    Records lacking a key are skipped, so test accuracy evaluated every few epochs plots as points
    joined by lines.
    """
    fig, axes = plt.subplots(1, len(keys), figsize=(4.2 * len(keys), 3.4), squeeze=False)
    for ax, key in zip(axes[0], keys):
        for label, records in runs.items():
            points = [(r["epoch"], r[key]) for r in records if r.get(key) is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        ax.set_xlabel("epoch")
        ax.set_title(key.replace("_", " "))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
