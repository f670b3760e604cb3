from __future__ import annotations

import io
from collections.abc import Sequence


def plot_panels(rows: Sequence[Sequence[dict]], title: str | None = None) -> bytes:
    """A grid of panels as PNG bytes: ``rows`` of panels, each ``{"title", "xlabel", "ylabel", "log_x",
    "series"}`` (a panel with ``matrix``, a list of rows, is also a heat map on ``vmin``..``vmax``; ``"ticks":
    False`` hides the axes' ticks, e.g. of an embedding; ``"legend"``: False for none, "outside" right of the panel,
    default one inside when the panel has several series), a series ``{"label", "x", "y", "yerr" (optional),
    "kind"}`` with kind

    * ``errorbar`` (default): markers joined by lines with ±yerr bars;
    * ``line``: black, ``linestyle`` (default dashed), no markers;
    * ``band``: a line with a shaded ±yerr band (e.g. a mean over seeds against epoch);
    * ``scatter``: points (``size``: their area in points², default 18; ``color``: a matplotlib colour);
    * ``bar``: one bar per category of ``x``, grouped with the panel's other bar series;
    * ``points``: ±xerr and ±yerr bars, each point annotated with ``labels``, joined by a line when ``joined``.

    The same inputs give the same bytes (matplotlib's Agg backend, no timestamps), so a page's figure can be
    checked like its tables."""
    from kdcollapse._optional import require

    matplotlib = require("matplotlib", "drawing a study's plots")  # here, not at import: the tables need none
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = max(len(r) for r in rows)
    fig, axes = plt.subplots(len(rows), columns, figsize=(max(4.0 * columns, 7.0), 3.4 * len(rows)), squeeze=False)
    for ax in axes.flat:
        ax.set_visible(False)
    for r, row in enumerate(rows):
        for c, panel in enumerate(row):
            ax = axes[r][c]
            ax.set_visible(True)
            xs = []
            if "matrix" in panel:  # a heat map: rows down, columns across, on the panel's vmin..vmax
                image = ax.imshow(panel["matrix"], vmin=panel.get("vmin"), vmax=panel.get("vmax"), cmap="PuBuGn")
                fig.colorbar(image, ax=ax, shrink=0.8)
            bars = [series for series in panel["series"] if series.get("kind") == "bar"]
            for i, series in enumerate(bars):  # grouped: the categories side by side, one bar per series in each
                width = 0.8 / len(bars)
                ax.bar([j + (i - (len(bars) - 1) / 2) * width for j in range(len(series["x"]))], series["y"], width,
                       yerr=series.get("yerr"), capsize=3, label=series["label"])
                ax.set_xticks(range(len(series["x"])), series["x"], fontsize=8)
            for series in (series for series in panel["series"] if series.get("kind") != "bar"):
                x, y, kind = list(series["x"]), list(series["y"]), series.get("kind", "errorbar")
                xs += x
                if kind == "scatter":
                    colour = {"color": series["color"]} if "color" in series else {}
                    ax.scatter(x, y, s=series.get("size", 18), label=series["label"], **colour)
                elif kind == "points":  # mean ± std in both directions, each point labelled
                    ax.errorbar(x, y, xerr=series.get("xerr"), yerr=series.get("yerr"), marker="o", markersize=4,
                                capsize=2, linestyle="-" if series.get("joined") else "none", label=series["label"])
                    for px, py, text in zip(x, y, series.get("labels") or []):
                        ax.annotate(text, (px, py), fontsize=6, xytext=(3, 3), textcoords="offset points")
                elif kind == "band":
                    line, = ax.plot(x, y, marker="o" if len(x) < 30 else None, markersize=3, label=series["label"])
                    err = list(series.get("yerr") or [0.0] * len(y))
                    ax.fill_between(x, [v - e for v, e in zip(y, err)], [v + e for v, e in zip(y, err)],
                                    color=line.get_color(), alpha=0.2, linewidth=0)
                elif kind == "line":
                    ax.plot(x, y, color="k", linestyle=series.get("linestyle", "--"), label=series["label"])
                else:
                    ax.errorbar(x, y, yerr=series.get("yerr"), marker="o", markersize=4, capsize=3,
                                label=series["label"])
            if panel.get("log_x"):
                ax.set_xscale("log")
                ax.minorticks_off()
                ticks = sorted(set(xs))
                ax.set_xticks(ticks, [f"{t:g}" for t in ticks])
            ax.set_title(panel.get("title", ""), fontsize=10)
            ax.set_xlabel(panel.get("xlabel", ""))
            ax.set_ylabel(panel.get("ylabel", ""))
            if panel.get("ticks", True) is False:
                ax.set_xticks([])
                ax.set_yticks([])
            elif "matrix" not in panel:
                ax.grid(alpha=0.3)
            if panel.get("legend") == "outside":
                ax.legend(fontsize=7, markerscale=2, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
            elif panel.get("legend", True) is not False and len(panel["series"]) > 1:
                ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    plt.close(fig)
    return buffer.getvalue()
