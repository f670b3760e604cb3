"""A summary's figures (its ``plots``), drawn from the records alone: one builder per kind, each returning the
panels :func:`kdcollapse.report.plot_panels` draws."""

from __future__ import annotations

import fnmatch
import statistics

import numpy as np

from kdcollapse.errors import ConfigError
from kdcollapse.report import plot_panels
from kdcollapse.study._cells import cell_means, section_cells
from kdcollapse.study._spec import Study
from kdcollapse.study._summary_spec import Measure, check_plot, check_summary, column


def figures(study: Study, records: dict) -> dict[str, bytes]:
    """The summary's ``plots``, file name → PNG bytes (:func:`kdcollapse.report.plot_panels`), drawn from the
    records alone. ``kind: means``: each cell of ``section`` at its mean ± std of ``x`` and ``y``, labelled, the cells
    matching the glob ``line`` joined. ``kind: bars``: one group of bars per cell of ``section``, one bar
    (mean ± std) per column metric
    of ``bars``. ``kind: cells``: one panel per entry of ``panels`` (a list of column metrics of ``section``),
    each metric's cell mean ± std against the grid field ``x`` (``lines``: metrics drawn as black lines, e.g.
    bounds). ``kind: scatter``: one row per section of ``sections``, one panel per column metric of ``x``, each
    run a point (``x``, ``y``), one colour per seed. ``kind: curves``: one panel per column metric of ``metrics``
    against epoch, one line per cell of ``section`` (those matching the glob ``cells``) at its mean over seeds with a
    ± std band, at the epochs every seed of the cell evaluated; it needs the per-epoch series, which a run's record
    keeps (``epochs``) for exactly the metrics a curves plot names. ``kind: matrices``: heat maps of a post step's
    matrices (:func:`_matrix_panels`); ``kind: embeddings``: a post step's 2-D embedding per cell
    (:func:`_embedding_panels`)."""
    spec = check_summary(study.summary)
    by_title = {part.get("title", ""): part for part in spec.get("sections") or []}
    out = {}
    for plot in spec.get("plots") or []:
        kind = check_plot(plot, tuple(by_title))
        titles = list(plot.get("sections") or []) if kind == "scatter" else [plot.get("section")]
        if kind == "cells":
            rows = [_cell_panels(study, records, spec, by_title[plot["section"]], plot)]
        elif kind == "bars":
            rows = [[_bar_panel(study, records, spec, by_title[plot["section"]], plot)]]
        elif kind == "means":
            rows = [[_means_panel(study, records, spec, by_title[plot["section"]], plot)]]
        elif kind == "curves":
            panels = _curve_panels(study, records, spec, by_title[plot["section"]], plot)
            rows = [panels[i:i + 4] for i in range(0, len(panels), 4)]  # four to a row
        elif kind == "matrices":
            panels = _matrix_panels(study, records, by_title[plot["section"]], plot)
            rows = [panels[i:i + 5] for i in range(0, len(panels), 5)]  # five to a row
        elif kind == "embeddings":
            panels = _embedding_panels(study, records, by_title[plot["section"]], plot)
            rows = [panels[i:i + 3] for i in range(0, len(panels), 3)]  # three to a row
        else:
            rows = [_scatter_panels(study, records, spec, by_title[t], plot) for t in titles]
        out[plot["file"]] = plot_panels(rows, plot.get("title"))
    return out


def _cell_panels(study, records, spec, section, plot) -> list[dict]:
    columns, cells, values = cell_means(study, records, spec, section)
    title = section.get("title", "")
    field = plot.get("x")
    if not cells or any(field not in values[label] for label in cells):
        raise ConfigError(f"plot {plot['file']!r}: 'x' must be a grid field of every cell of section {title!r}, got "
                          f"{field!r}")
    order = sorted(cells, key=lambda label: values[label][field])
    lines = set(plot.get("lines") or [])
    panels = []
    for metrics in plot.get("panels") or []:
        series = []
        for name in (m for m in metrics if m not in lines):
            m = column(columns, name, title)
            ys = [[m.of(r) for r in cells[c].values()] for c in order]
            series.append({"label": m.label, "x": [values[c][field] for c in order],
                           "y": [statistics.mean(y) for y in ys],
                           "yerr": [statistics.stdev(y) if len(y) > 1 else 0.0 for y in ys]})
        for style, name in zip(("--", ":", "-."), [m for m in metrics if m in lines]):
            m = column(columns, name, title)
            series.append({"label": m.label, "kind": "line", "linestyle": style, "x": [values[c][field] for c in order],
                           "y": [statistics.mean(m.of(r) for r in cells[c].values()) for c in order]})
        panels.append({"title": series[0]["label"] if series else "", "xlabel": plot.get("xlabel", field),
                       "log_x": bool(plot.get("log_x")), "series": series})
    return panels


def _curve_panels(study, records, spec, section, plot) -> list[dict]:
    """One panel per metric of ``metrics``: each cell's mean ± std over its seeds at every epoch all of them
    evaluated, from the records' ``epochs``."""
    columns, cells, _ = cell_means(study, records, spec, section)
    title = section.get("title", "")
    cells = {label: runs for label, runs in cells.items() if fnmatch.fnmatchcase(label, plot.get("cells") or "*")}
    if not plot.get("metrics") or not cells:
        raise ConfigError(f"plot {plot['file']!r}: 'metrics' lists column metrics of section {title!r} and 'cells' "
                          f"matches some of its cells with records, got {plot.get('metrics')!r}, "
                          f"{plot.get('cells')!r}")
    labels = plot.get("labels") or [None] * len(plot["metrics"])
    if len(labels) != len(plot["metrics"]):
        raise ConfigError(f"plot {plot['file']!r}: 'labels' names each metric's panel, one per metric of "
                          f"{plot['metrics']!r}; got {labels!r}")
    panels = []
    for name, panel_label in zip(plot["metrics"], labels):  # a metric that is no column is drawn under its name
        m = next((c for c in columns if c.metric == name), None) or Measure(name, "last", name.replace("_", " "))
        series = []
        for label, runs in cells.items():
            missing = [s for s, r in runs.items() if m.metric not in r.get("epochs", {})]
            if missing:
                raise ConfigError(f"plot {plot['file']!r}: the records of cell {label!r} (seeds "
                                  f"{','.join(map(str, missing))}) keep no per-epoch {m.metric}; run "
                                  "`kdcollapse study report` where the runs are, to record it")
            by_seed = [dict(map(tuple, r["epochs"][m.metric])) for r in runs.values()]
            epochs = sorted(set.intersection(*(set(e) for e in by_seed)))
            ys = [[e[epoch] * m.scale for e in by_seed] for epoch in epochs]
            series.append({"label": f"{label} ({len(by_seed)} seed{'s' if len(by_seed) > 1 else ''})",
                           "kind": "band", "x": epochs, "y": [statistics.mean(y) for y in ys],
                           "yerr": [statistics.stdev(y) if len(y) > 1 else 0.0 for y in ys]})
        panels.append({"title": panel_label or m.label, "xlabel": "epoch", "series": series})
    return panels


def _matrix_panels(study, records, section, plot) -> list[dict]:
    """One heat map per cell of ``section`` (those matching the glob ``cells``) and matrix of ``matrices`` that its
    records hold: |M| with the diagonal set to 0 (the DHKD paper's App. H view of a logit-difference matrix), the
    mean over the cell's seeds, every panel on one colour scale; ``labels`` names the matrices (default: their
    keys)."""

    cells, _ = section_cells(study, records, section)
    title = section.get("title", "")
    names = plot.get("labels") or plot.get("matrices") or []
    if not plot.get("matrices") or len(names) != len(plot["matrices"]):
        raise ConfigError(f"plot {plot['file']!r}: 'matrices' lists post-step matrix keys (e.g. "
                          f"analysis_test/logit_matrices/main/matrix) and 'labels' one name for each, got "
                          f"{plot.get('matrices')!r}, {plot.get('labels')!r}")
    panels = []
    for label, runs in cells.items():
        if not fnmatch.fnmatchcase(label, plot.get("cells") or "*") or not runs:
            continue
        for key, name in zip(plot["matrices"], names):
            held = [r["matrices"][key] for r in runs.values() if key in r.get("matrices", {})]
            if not held:
                continue
            if len(held) != len(runs):
                raise ConfigError(f"plot {plot['file']!r}: cell {label!r} of section {title!r} holds {key} for "
                                  f"{len(held)} of its {len(runs)} seeds; run `kdcollapse study report` where the runs "
                                  "are, to record it")
            shown = np.mean([np.abs(np.asarray(m, dtype=float)) for m in held], axis=0)
            np.fill_diagonal(shown, 0.0)
            off = shown[~np.eye(len(shown), dtype=bool)].mean()
            panels.append({"title": f"{label}, {name}: mean {off:.3f}" + (f" ({len(held)} seeds)" if len(held) > 1
                                                                           else ""),
                           "xlabel": "logit j", "ylabel": "true class k", "matrix": shown.tolist(), "series": []})
    if not panels:
        raise ConfigError(f"plot {plot['file']!r}: no cell of section {title!r} matching {plot.get('cells') or '*'!r} "
                          f"holds any of {plot['matrices']!r}; run `kdcollapse study report` where the runs are, or "
                          "name committed copies of their post files in the summary's 'reports'")
    top = max(max(max(row) for row in p["matrix"]) for p in panels) or 1.0
    return [p | {"vmin": 0.0, "vmax": top} for p in panels]


def _embedding_panels(study, records, section, plot) -> list[dict]:
    """One scatter panel per cell of ``section`` (those matching the glob ``cells``): the post step's 2-D embedding
    at ``embedding`` (``analyze --tsne-per-class``'s ``tsne``: ``embedding``, ``labels``, ``class_names``,
    ``classes``) of the cell's run of the lowest seed, one colour per class, the same class the same colour in every
    panel. An embedding is one run's (no mean over seeds); a cell whose runs hold none is refused."""
    cells, _ = section_cells(study, records, section)
    title, key = section.get("title", ""), plot.get("embedding")
    if not isinstance(key, str) or not key:
        raise ConfigError(f"plot {plot['file']!r}: 'embedding' is a post step's embedding key (e.g. analysis_test/tsne, "
                          f"what `analyze --tsne-per-class N` writes), got {key!r}")
    panels = []
    for label, runs in cells.items():
        if not fnmatch.fnmatchcase(label, plot.get("cells") or "*") or not runs:
            continue
        held = {s: r["embeddings"][key] for s, r in sorted(runs.items()) if key in r.get("embeddings", {})}
        if not held:
            raise ConfigError(f"plot {plot['file']!r}: no run of cell {label!r} of section {title!r} holds {key}; run "
                              "`kdcollapse study report` where the runs are, or name committed copies of their post "
                              "files in the summary's 'reports'")
        seed, tsne = next(iter(held.items()))
        points, labels = tsne["embedding"], tsne["labels"]
        if len(points) != len(labels) or any(c not in tsne["classes"] for c in labels):
            raise ConfigError(f"plot {plot['file']!r}: the {key} of cell {label!r} (seed {seed}) has {len(points)} "
                              f"points and {len(labels)} labels, or labels outside its classes {tsne['classes']}")
        series = [{"label": name, "kind": "scatter", "size": 3, "color": f"C{i % 10}",
                   "x": [p[0] for p, c in zip(points, labels) if c == k],
                   "y": [p[1] for p, c in zip(points, labels) if c == k]}
                  for i, (k, name) in enumerate(zip(tsne["classes"], tsne["class_names"]))]
        panels.append({"title": f"{label}" + (f" (seed {seed})" if len(runs) > 1 else ""), "series": series,
                       "ticks": False, "legend": False})
    if not panels:
        raise ConfigError(f"plot {plot['file']!r}: no cell of section {title!r} matches {plot.get('cells') or '*'!r}")
    panels[-1]["legend"] = "outside"  # one legend: the classes are the same in every panel
    return panels


def _means_panel(study, records, spec, section, plot) -> dict:
    """Each cell's mean ± std of ``y`` against its mean ± std of ``x``, labelled; the cells matching ``line`` (a
    glob) joined in the order of ``x``, the others as points."""
    columns, cells, _ = cell_means(study, records, spec, section)
    title = section.get("title", "")
    x, y = column(columns, plot.get("x"), title), column(columns, plot.get("y"), title)
    groups = {True: [], False: []}
    for label, runs in cells.items():
        xs, ys = [x.of(r) for r in runs.values() if y.has(r)], [y.of(r) for r in runs.values() if y.has(r)]
        if xs:
            groups[fnmatch.fnmatchcase(label, plot.get("line") or "")].append((label, xs, ys))

    def series(items, joined: bool) -> dict:
        items = sorted(items, key=lambda item: statistics.mean(item[1])) if joined else items
        sd = lambda v: statistics.stdev(v) if len(v) > 1 else 0.0  # noqa: E731
        return {"label": plot.get("line") if joined else "other cells", "kind": "points", "joined": joined,
                "x": [statistics.mean(i[1]) for i in items], "y": [statistics.mean(i[2]) for i in items],
                "xerr": [sd(i[1]) for i in items], "yerr": [sd(i[2]) for i in items], "labels": [i[0] for i in items]}

    return {"title": title, "xlabel": x.label, "ylabel": y.label,
            "series": [series(items, joined) for joined, items in ((True, groups[True]), (False, groups[False]))
                       if items]}


def _bar_panel(study, records, spec, section, plot) -> dict:
    columns, cells, _ = cell_means(study, records, spec, section)
    title = section.get("title", "")
    series = []
    for name in plot.get("bars") or []:
        m = column(columns, name, title)
        ys = [[m.of(r) for r in runs.values()] for runs in cells.values()]
        series.append({"label": m.label, "kind": "bar", "x": list(cells), "y": [statistics.mean(y) for y in ys],
                       "yerr": [statistics.stdev(y) if len(y) > 1 else 0.0 for y in ys]})
    return {"title": title, "ylabel": plot.get("ylabel", ""), "series": series}


def _scatter_panels(study, records, spec, section, plot) -> list[dict]:
    columns, cells, _ = cell_means(study, records, spec, section)
    title = section.get("title", "")
    y = column(columns, plot.get("y"), title)
    seeds = sorted({s for runs in cells.values() for s in runs})
    panels = []
    for name in plot.get("x") or []:
        x = column(columns, name, title)
        series = [{"label": f"seed {s}", "kind": "scatter",
                   "x": [x.of(runs[s]) for runs in cells.values() if s in runs],
                   "y": [y.of(runs[s]) for runs in cells.values() if s in runs]} for s in seeds]
        panels.append({"title": title, "xlabel": x.label, "ylabel": y.label, "series": series})
    return panels
