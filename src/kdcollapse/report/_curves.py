from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from kdcollapse.errors import KdcollapseError


def plot_curves(runs: Mapping[str, Sequence[dict]], keys: Sequence[str], path: str | Path,
                title: str | None = None, columns: int = 4, save: Callable | None = None) -> Path:
    """One panel per metric key (``columns`` panels per row), one line per run; records are
    ``metrics.jsonl`` rows (with ``epoch``).

    Records lacking a key are skipped, so test accuracy evaluated every few epochs plots as points
    joined by lines. ``save(fig, path, dpi=...)`` writes the figure (default: ``fig.savefig``; the CLI's
    writes atomically and records the runs' provenance).
    """
    if not runs or not keys:
        raise KdcollapseError(f"plot_curves needs at least one run and one key, got {len(runs)} runs and keys "
                              f"{list(keys)!r}")
    import matplotlib  # here, not at import: `kdcollapse.report.markdown_table` users need no matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(columns, len(keys))
    rows = -(-len(keys) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(4.2 * columns, 3.4 * rows), squeeze=False)
    for ax in axes.flat[len(keys):]:
        ax.set_visible(False)
    for ax, key in zip(axes.flat, keys):
        for label, records in runs.items():
            points = [(r["epoch"] if "epoch" in r else r["step"], r[key]) for r in records if r.get(key) is not None]
            if points:
                xs, ys = zip(*points)
                ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
        ax.set_xlabel("epoch" if any("epoch" in r for records in runs.values() for r in records) else "step")
        ax.set_title(key.replace("_", " "))
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    (save or type(fig).savefig)(fig, path, dpi=120)
    plt.close(fig)
    return path
