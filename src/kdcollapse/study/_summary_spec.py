"""A study's ``summary:`` spec, checked: the page's keys and defaults, its columns (:class:`Measure`: a metric
of a run at an epoch), the sections' keys, the plots' keys by kind, and which metrics a run's record keeps for
them. Everything here reads the spec alone; :func:`check_summary` is run when the study file is read, so a
summary that names a group, section or plot key that does not exist is refused before any run starts."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.errors import ConfigError, unknown_choice
from kdcollapse.study._choice import validation_only
from kdcollapse.study._tables import check_tables

# best: the selected epoch; last, first: those epochs; falls: how many evaluated epochs were lower than the one before
AT = ("best", "last", "first", "falls")
SUMMARY_KEYS = ("select", "metric", "columns", "noise_floor", "unit", "alpha", "correction", "better", "sections",
                "plots", "tables", "history", "reports")
GAP_KEYS = ("to", "from", "metric", "log", "label", "digits")  # a section's gap (kdcollapse.study._gap)
SECTION_KEYS = ("title", "cells", "columns", "choose", "compare", "correlate", "front", "gap")
CELL_KEYS = ("label", "group", "where", "short", "chosen_by")
MEASURE_KEYS = ("metric", "at", "label", "digits", "noise_floor", "unit", "better", "scale", "seeds")
BETTER = ("higher", "lower", "none")
PLOT_KEYS = {"cells": ("file", "kind", "title", "section", "x", "panels", "lines", "log_x", "xlabel"),
             "scatter": ("file", "kind", "title", "sections", "x", "y"),
             "bars": ("file", "kind", "title", "section", "bars", "ylabel"),
             "means": ("file", "kind", "title", "section", "x", "y", "line"),
             "curves": ("file", "kind", "title", "section", "metrics", "cells", "labels"),
             "matrices": ("file", "kind", "title", "section", "matrices", "cells", "labels"),
             "embeddings": ("file", "kind", "title", "section", "embedding", "cells")}


def flat(items: list) -> list:
    """A list with its nested lists (a YAML alias of a shared list) spliced in."""
    return [x for item in items for x in (flat(item) if isinstance(item, list) else [item])]


@dataclass(frozen=True)
class Measure:
    """A number of a run: ``metric`` at epoch ``at`` ("best": the selected epoch, or "last"), shown with
    ``digits`` decimals."""

    metric: str
    at: str
    label: str
    digits: int = 2
    noise_floor: float | None = None  # for a comparison of this measure; None: the page's
    unit: str | None = None  # of this measure's differences; None: the page's
    better: str | None = None  # which direction the verdict calls "better": higher, lower, or none
    # ("higher"/"lower"); None: the page's (the summary's ``better``, higher by default)
    scale: float = 1.0  # the stored number times this (100: a fraction shown in %)
    seeds: bool = False  # the cell lists every seed's value (in seed order) instead of mean ± std

    @classmethod
    def parse(cls, spec, select: str | None) -> Measure:
        if not isinstance(spec, dict) or set(spec) - set(MEASURE_KEYS) or "metric" not in spec:
            raise ConfigError(f"a summary column is {{metric: NAME, at: best | last, label: TEXT, digits: N, "
                              f"noise_floor: X, unit: TEXT}}, got {spec!r}")
        at = spec.get("at", "best" if select else "last")
        if at not in AT:
            raise ConfigError(unknown_choice("summary column 'at'", at, AT))
        if at == "best" and select is None:
            raise ConfigError(f"summary column {spec['metric']!r} is read 'at: best', but the summary selects no epoch "
                              "(select: null, no validation split); read it 'at: last'")
        digits = spec.get("digits", 2)
        if not isinstance(digits, int) or not 0 <= digits <= 8:
            raise ConfigError(f"summary column {spec['metric']!r}: 'digits' is an integer from 0 to 8, got {digits!r}")
        where = {"last": "last epoch", "first": "first epoch", "falls": "epochs where it fell"}.get(at) or \
            f"best {select.removeprefix('val_').replace('_', ' ')} on val"
        floor = spec.get("noise_floor")
        if floor is not None and (isinstance(floor, bool) or not isinstance(floor, int | float) or floor < 0):
            raise ConfigError(f"summary column {spec['metric']!r}: 'noise_floor' is a number ≥ 0, got {floor!r}")
        better = spec.get("better")
        if better is not None and better not in BETTER:
            raise ConfigError(unknown_choice(f"summary column {spec['metric']!r} 'better'", better, BETTER))
        scale = spec.get("scale", 1.0)
        if isinstance(scale, bool) or not isinstance(scale, int | float) or scale <= 0:
            raise ConfigError(f"summary column {spec['metric']!r}: 'scale' is a number > 0, got {scale!r}")
        return cls(spec["metric"], at, spec.get("label", f"{spec['metric']} at {where}"), digits,
                   None if floor is None else float(floor), spec.get("unit"), better, float(scale),
                   _flag(spec, "seeds"))

    def has(self, record: dict) -> bool:
        return self.metric in record.get(self.at, {})

    def of(self, record: dict) -> float:
        value = record[self.at][self.metric]
        return value if self.scale == 1.0 else value * self.scale


def _flag(spec: dict, key: str) -> bool:
    if not isinstance(value := spec.get(key, False), bool):
        raise ConfigError(f"summary column {spec['metric']!r}: {key!r} is true or false, got {value!r}")
    return value


def check_summary(spec: dict) -> dict:
    """The summary spec with its defaults; refuses a selection or a choice that reads anything but validation."""
    if not isinstance(spec, dict):
        raise ConfigError("the study has no 'summary' (a mapping: select, metric, columns, sections, ...)")
    for key in spec:
        if key not in SUMMARY_KEYS:
            raise ConfigError(unknown_choice("key of summary", key, SUMMARY_KEYS))
    spec = {"select": "val_acc", "noise_floor": 0.0, "unit": "pp", "alpha": 0.05, "correction": "holm",
            "better": "higher", **spec}
    if spec["better"] not in BETTER:
        raise ConfigError(unknown_choice("summary 'better' (which direction of the compared metrics is better, "
                                         "unless a column says its own)", spec["better"], BETTER))
    if spec["select"] is not None:
        validation_only(spec["select"], "selects each run's epoch on")
    if spec["correction"] != "holm":
        raise ConfigError(unknown_choice("summary correction", spec["correction"], ("holm",)))
    for section in spec.get("sections") or []:
        for key in section:
            if key not in SECTION_KEYS:
                raise ConfigError(unknown_choice("key of a summary section", key, SECTION_KEYS))
        if "gap" in section:
            check_gap(section["gap"], section.get("title", ""))
        if "choose" in section:  # without a selected epoch (select: null), on the last epoch's validation value
            if set(section["choose"]) - {"among", "by", "lowest"}:
                raise ConfigError(f"a section's choose is {{among: CELLS, by: val_METRIC, lowest: false}}, got "
                                  f"{section['choose']!r}")
            validation_only(section["choose"].get("by", ""), "chooses among cells on")
    if "tables" in spec:
        check_tables(spec["tables"], spec.get("sections") or [])
    titles = tuple(part.get("title", "") for part in spec.get("sections") or [])
    for plot in spec.get("plots") or []:
        check_plot(plot, titles)
    return spec


def check_gap(gap, title: str) -> None:
    """Refuse a malformed section ``gap``, naming its keys."""
    if not isinstance(gap, dict) or set(gap) - set(GAP_KEYS) or not {"to", "from"} <= set(gap) or \
            not isinstance(gap.get("log", False), bool) or not isinstance(gap.get("digits", 3), int) or \
            isinstance(gap.get("digits", 3), bool):
        raise ConfigError(f"section {title!r}: 'gap' is {{to: CELL (the target, e.g. the teacher), from: CELL (the "
                          f"reference, paired by seed), metric: a column's metric (default the page's), log: true | "
                          f"false, label: TEXT, digits: N}}, got {gap!r}")


def check_plot(plot, titles: tuple[str, ...]) -> str:
    """``plot``'s kind, once its keys are those of its kind and its sections are among ``titles``."""
    kind = plot.get("kind", "cells") if isinstance(plot, dict) else None
    if kind not in PLOT_KEYS or set(plot) - set(PLOT_KEYS[kind]) or "file" not in plot \
            or not str(plot["file"]).endswith(".png") or "/" in str(plot["file"]):
        kinds = "; ".join(f"{k}: {', '.join(keys)}" for k, keys in PLOT_KEYS.items())
        raise ConfigError(f"a summary plot is a file NAME.png beside the study file and, by kind, the keys {kinds} "
                          f"(kind: cells if left out); got {plot!r}")
    for title in list(plot.get("sections") or []) if kind == "scatter" else [plot.get("section")]:
        if title not in titles:
            raise ConfigError(unknown_choice(f"section of plot {plot['file']!r}", title, titles))
    return kind


def check_cells(spec: dict, fields: dict[str, set[str] | None]) -> None:
    """Refuse a cell of a section that names a group the study does not have (``fields``: each group's grid
    fields, None for a group whose choice is not made yet), a ``chosen_by`` that is not a group, a key no cell
    has, or a ``where`` on a field its group's runs do not have."""
    for section in spec.get("sections") or []:
        title = section.get("title", "")
        cells = section.get("cells") or []
        if not isinstance(cells, list):
            raise ConfigError(f"section {title!r}: 'cells' is a list of {{{', '.join(CELL_KEYS)}}}, got {cells!r}")
        for cell in cells:
            if not isinstance(cell, dict) or "group" not in cell or "label" not in cell:
                raise ConfigError(f"section {title!r}: a cell is a mapping with at least 'label' and 'group' (keys: "
                                  f"{', '.join(CELL_KEYS)}), got {cell!r}")
            for key in cell:
                if key not in CELL_KEYS:
                    raise ConfigError(unknown_choice(f"key of a cell of section {title!r}", key, CELL_KEYS))
            for key in ("group", "chosen_by"):
                if key in cell and cell[key] not in fields:
                    raise ConfigError(unknown_choice(f"{key} of cell {cell['label']!r} of section {title!r} (a group "
                                                     "of the study)", cell[key], tuple(fields)))
            where, known = cell.get("where") or {}, fields[cell["group"]]
            if not isinstance(where, dict):
                raise ConfigError(f"cell {cell['label']!r} of section {title!r}: 'where' maps grid fields to values, "
                                  f"got {where!r}")
            if known is not None and (unknown := [k for k in where if k not in known]):
                raise ConfigError(unknown_choice(f"field of 'where' of cell {cell['label']!r} of section {title!r} "
                                                 f"(a grid field of group {cell['group']!r})", unknown[0],
                                                 tuple(sorted(known))))


def measures(spec: dict, section: dict | None = None) -> list[Measure]:
    """The columns of ``section``'s cell table (its own ``columns``, else the page's); without a section, every
    column of the page and of its sections (what a run's record keeps)."""
    if section is not None:
        return [Measure.parse(c, spec["select"]) for c in flat(section.get("columns") or spec.get("columns")
                                                                 or [spec["metric"]])]
    return [m for part in (None, *(spec.get("sections") or [])) for m in measures(spec, part or {})]


def record_keys(spec: dict) -> set[str]:
    """The metrics a run's record keeps: the columns', the compared one, the selection's and the choices'."""
    return {m.metric for m in measures(spec)} | {Measure.parse(spec["metric"], spec["select"]).metric} | (
        {spec["select"]} if spec["select"] else set()) | {
        s["choose"]["by"] for s in spec.get("sections") or [] if "choose" in s}


def curve_keys(spec: dict) -> list[str]:
    """The metrics whose per-epoch series a run's record keeps (``epochs``): those a ``kind: curves`` plot draws."""
    return sorted({m for plot in spec.get("plots") or [] if isinstance(plot, dict) and plot.get("kind") == "curves"
                   for m in plot.get("metrics") or []})


def kept_keys(spec: dict) -> dict[str, list[str]]:
    """The post-step values a run's record keeps, by the record's field: ``matrices``, those a ``kind: matrices``
    plot draws, and ``embeddings``, the ``embedding`` of a ``kind: embeddings`` plot (fields without keys left out)."""
    plots = [p for p in spec.get("plots") or [] if isinstance(p, dict)]
    kept = {"matrices": {m for p in plots if p.get("kind") == "matrices" for m in p.get("matrices") or []},
            "embeddings": {p["embedding"] for p in plots if p.get("kind") == "embeddings"
                           and isinstance(p.get("embedding"), str)}}
    return {field: sorted(keys) for field, keys in kept.items() if keys}


def column(columns: list[Measure], metric: str, title: str) -> Measure:
    """The first of a section's columns that reads ``metric``."""
    for c in columns:
        if c.metric == metric:
            return c
    raise ConfigError(unknown_choice(f"metric of a comparison or correlation in section {title!r} (one of its "
                                     "columns)", metric, tuple(dict.fromkeys(c.metric for c in columns))))
