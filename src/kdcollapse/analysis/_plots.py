"""The figures of ``kdcollapse analyze``: spectra, margins, t-SNE, teacher-student logit matrices and a language
model's next-token collapse against depth."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from kdcollapse._optional import pyplot as plt
from kdcollapse._optional import ticker
from kdcollapse.runs import save_figure


def _save(fig, path: Path, source: dict | None, **savefig) -> str:
    """Write ``fig`` atomically with ``source`` (what it was computed from) in its metadata; returns the name."""
    if "bbox_inches" not in savefig:
        fig.tight_layout()
    save_figure(fig, path, source, dpi=110, **savefig)
    plt.close(fig)
    return path.name


def plot_spectra(spectra: Mapping[str, Sequence[float]], rank: int, path: Path, title: str,
                 source: dict | None = None) -> str:
    """Eigenvalues of Sigma_T, Sigma_B and Sigma_W, largest first, on a log scale (VCI paper Fig. 2).

    Eigenvalues below 1e-12 of the largest are left out: zeros, the eigensolver's rounding noise, and
    that of float32 features (relative variance ~eps^2 = 1.4e-14), which would stretch the axis down to
    1e-17 and hide the spectrum; analysis.json keeps every eigenvalue. The dashed
    line marks min(d, K - 1), the most non-zero eigenvalues Sigma_B can have.
    """
    fig, ax = plt.subplots(figsize=(5.2, 3.6))
    top = max(max(values) for values in spectra.values())
    styles = (("total", r"$\Sigma_T$", 3.0), ("between", r"$\Sigma_B$", 1.2), ("within", r"$\Sigma_W$", 1.2))
    for name, label, width in styles:
        values = np.asarray(spectra[name], dtype=float)
        index = np.arange(1, values.size + 1)
        shown = values > top * 1e-12  # below: rounding noise of float32 features and of the eigensolver
        ax.semilogy(index[shown], values[shown], linewidth=width, alpha=0.75, label=label)
    ax.axvline(rank, color="grey", linestyle="--", linewidth=1, label=f"min(d, K−1) = {rank}")
    ax.set_xlabel("eigenvalue index")
    ax.set_ylabel("eigenvalue")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    return _save(fig, path, source)


def plot_margins(margins: np.ndarray, labels: np.ndarray, classes: Sequence[str], path: Path, title: str,
                 source: dict | None = None) -> str:
    """Per-class box plots of the logit margins z_y − max_{j≠y} z_j (whiskers at the 5th/95th
    percentiles); below the zero line a sample is misclassified."""
    k = len(classes)
    groups = [margins[labels == c] for c in range(k)]
    fig, ax = plt.subplots(figsize=(max(5.0, 0.45 * k + 1.5), 3.6))
    ax.boxplot(groups, whis=(5, 95), showfliers=False, widths=0.6)
    ax.axhline(0.0, color="red", linewidth=1)
    ax.set_xticks(range(1, k + 1), [_short(c) for c in classes], rotation=60 if k > 10 else 0, fontsize=7)
    ax.set_ylabel(r"logit margin $z_y - \max_{j\neq y} z_j$")
    ax.set_title(title, fontsize=9)
    ax.grid(alpha=0.3, axis="y")
    return _save(fig, path, source)


def plot_tsne(embedding: np.ndarray, labels: np.ndarray, classes: Sequence[str], path: Path, title: str,
              source: dict | None = None) -> str:
    """Scatter of a 2-D t-SNE embedding of features, one colour per class (DHKD App. G)."""
    fig, ax = plt.subplots(figsize=(5.2, 4.6))
    colours = plt.get_cmap("tab10" if len(set(labels.tolist())) <= 10 else "tab20")
    for i, c in enumerate(sorted(set(labels.tolist()))):
        points = embedding[labels == c]
        ax.scatter(points[:, 0], points[:, 1], s=4, color=colours(i % colours.N), label=_short(classes[c]))
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, markerscale=3, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
    return _save(fig, path, source)


def plot_logit_matrices(matrices: Mapping[str, np.ndarray], path: Path, title: str,
                        source: dict | None = None) -> str:
    """Heat maps of |M^t − M^s| per head, diagonal set to 0, on one shared colour scale (DHKD App. H)."""
    shown = {}
    for name, matrix in matrices.items():
        absolute = np.abs(np.asarray(matrix, dtype=float))
        np.fill_diagonal(absolute, 0.0)
        shown[name] = absolute
    top = max(float(m.max()) for m in shown.values()) or 1.0
    fig, axes = plt.subplots(1, len(shown), figsize=(3.6 * len(shown) + 0.8, 3.4), squeeze=False)
    for ax, (name, absolute) in zip(axes[0], shown.items()):
        image = ax.imshow(absolute, vmin=0.0, vmax=top, cmap="PuBuGn")
        mean = absolute[~np.eye(len(absolute), dtype=bool)].mean()
        ax.set_title(f"{name} head: mean {mean:.3f}", fontsize=9)
        ax.set_xlabel("logit j")
        ax.set_ylabel("true class k")
        ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(ticker.MaxNLocator(integer=True))
    fig.colorbar(image, ax=axes[0].tolist(), shrink=0.85)
    fig.suptitle(title, fontsize=9)
    return _save(fig, path, source, bbox_inches="tight")


def _short(name: str, width: int = 12) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


TOKEN_LAYER_KEYS = ("nc1", "cdnv", "vci", "gnc1")


def plot_token_layers(models: Mapping[str, Sequence[Mapping]], path: Path,
                      keys: Sequence[str] = TOKEN_LAYER_KEYS, title: str = "", source: dict | None = None) -> str:
    """Metrics against depth, one line per model: ``models`` maps a label to the ``analyze_tokens`` results
    of its seeds (one for a single model), drawn as the mean over seeds with a band of ± one standard
    deviation. The x axis is the hidden state's index divided by the model's number of layers (0 the
    embeddings, 1 the classifier's input), so models of different depths share it; with one model it is the
    index itself. NC1, CDNV and GNC1 on a log scale, VCI linear; a metric a layer lacks (nan) is a gap.
    ``source``: what the figure was computed from, kept in its metadata as for the other figures."""
    fig, axes = plt.subplots(1, len(keys), figsize=(3.6 * len(keys), 3.2), squeeze=False)
    relative = len(models) > 1
    for label, results in models.items():
        last = results[0]["num_hidden_states"] - 1
        depth = sorted(int(i) for i in results[0]["layers"])
        x = np.asarray(depth, dtype=float) / (last if relative else 1)
        for ax, key in zip(axes[0], keys):
            values = np.array([[r["layers"][_layer_key(r, i)].get(key, np.nan) for i in depth] for r in results], float)
            mean = values.mean(0)
            line = ax.plot(x, mean, marker="o", markersize=3 if len(depth) > 8 else 5, label=label or None)[0]
            if len(results) > 1:
                std = values.std(0, ddof=1)
                ax.fill_between(x, mean - std, mean + std, color=line.get_color(), alpha=0.2)
    for ax, key in zip(axes[0], keys):
        ax.set(xlabel="depth (hidden state / layers)" if relative else "hidden state (0 = embeddings)", title=key,
               yscale="linear" if key == "vci" else "log")
        ax.grid(alpha=0.3, which="both")
    if any(models):
        axes[0][-1].legend(fontsize=7)
    if title:
        fig.suptitle(title, fontsize=9)
    return _save(fig, Path(path), source)


def _layer_key(result: Mapping, layer: int):
    """``analyze_tokens`` keys its layers by int; the same result read back from JSON, by str."""
    return layer if layer in result["layers"] else str(layer)


def plot_stages(stages: Mapping[str, Mapping], features: Mapping, path: Path, title: str, source: dict | None = None,
                keys: Sequence[str] = ("nc1", "vci", "nc2_etf_error", "nc2g_log_var")) -> str:
    """Each metric of ``keys`` against depth: the stages' pooled maps in order, then the penultimate features."""
    names = [*stages, "features"]
    rows = [*stages.values(), features]
    fig, axes = plt.subplots(1, len(keys), figsize=(3.4 * len(keys), 3.0), squeeze=False)
    for ax, key in zip(axes[0], keys):
        ax.plot(range(len(names)), [float(r.get(key, np.nan)) for r in rows], marker="o")
        ax.set_xticks(range(len(names)), names, rotation=30, fontsize=7)
        ax.set(title=key, yscale="linear" if key in ("vci", "nc2g_log_var") else "log")
        ax.grid(alpha=0.3, which="both")
    fig.suptitle(title, fontsize=9)
    return _save(fig, Path(path), source)
