"""A summary section's cells: for each cell spec ``{label, group, where, short, chosen_by}``, its runs' records
by seed (a label with grid fields makes one cell per value), read from the records alone."""

from __future__ import annotations

from kdcollapse.errors import ConfigError, unknown_choice
from kdcollapse.study._spec import Study
from kdcollapse.study._summary_spec import Measure, measures


def section_cells(study: Study, records: dict, section: dict) -> tuple[dict[str, dict[int, dict]], dict[str, str]]:
    """Cell label → seed → record, for each cell spec ``{label, group, where, short}`` (a label with grid
    fields makes one cell per value), and short name → label for the cells that have one (comparisons may
    name a cell by either and show the short one)."""
    cells: dict[str, dict[int, dict]] = {}
    shorts = {}
    for cell in section.get("cells") or []:
        where = cell.get("where") or {}
        chosen = _chosen_settings(study, cell)
        for name, run in study.runs.items():
            if run.group != cell["group"] or any(run.values.get(k) != v for k, v in where.items()):
                continue
            if chosen is not None and {k: v for k, v in run.values.items() if k != "seed"} not in chosen:
                continue
            label = str(cell["label"]).format(**run.values)
            if "short" in cell:  # fields allowed, as in the label
                shorts[str(cell["short"]).format(**run.values)] = label
            cells.setdefault(label, {})
            if name in records:
                cells[label][run.values["seed"]] = records[name]
    return cells, shorts


def _chosen_settings(study: Study, cell: dict) -> list[dict] | None:
    """With ``chosen_by: GROUP`` (a group with ``choose``), the settings that group chose: a cell of the chosen
    group's source runs keeps only those (e.g. the seed-0 run of the chosen value beside the chosen group's seeds)."""
    if "chosen_by" not in cell:
        return None
    groups = {run.group for run in study.runs.values()} | {w[0] for w in study.waiting}
    if cell["chosen_by"] not in groups:
        raise ConfigError(unknown_choice("a cell's 'chosen_by' (a group with 'choose')", cell["chosen_by"],
                                         tuple(sorted(groups))))
    return [{k: v for k, v in run.values.items() if k != "seed"} for run in study.runs.values()
            if run.group == cell["chosen_by"]]


def cell_means(study, records, spec, section) -> tuple[list[Measure], dict[str, dict[int, dict]], dict[str, dict]]:
    columns = measures(spec, section)
    cells, _ = section_cells(study, records, section)
    cells = {label: {s: r for s, r in runs.items() if "diverged" not in r} for label, runs in cells.items()}
    values = {}
    for cell in section.get("cells") or []:
        for run in study.runs.values():
            if run.group == cell["group"] and all(run.values.get(k) == v for k, v in (cell.get("where") or {}).items()):
                values.setdefault(str(cell["label"]).format(**run.values), run.values)
    return columns, {label: runs for label, runs in cells.items() if runs}, values
