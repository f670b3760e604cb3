"""The choice rule, one for a summary section's ``choose`` and a group's ``choose`` (made when the study file is
read): the candidate with the highest mean validation metric over the seeds every candidate shares, the first on
a tie; choices read validation metrics only (``val_*``), never test ones."""

from __future__ import annotations

import fnmatch
import json
import statistics

from kdcollapse.errors import ConfigError
from kdcollapse.runs import read_committed_metrics
from kdcollapse.study._runs import RESULT_FILE, RunSpec, state_of


def validation_only(metric: str, what: str) -> None:
    """Refuse ``metric`` unless it is a validation metric (``val_*``); ``what`` says what reads it."""
    if not str(metric).startswith("val_"):
        raise ConfigError(f"the summary {what} {metric!r}: a selection may read validation metrics only (val_*), "
                          "never test ones; add a validation split (data.val_per_class) and select on it")


def choose(cells: dict, choose: dict, at: str = "best") -> tuple[str | None, list[int]]:
    """The candidate cell with the highest mean (``lowest: true``: the lowest, e.g. a perplexity) of validation
    metric ``by`` at epoch ``at`` over the seeds every candidate has (the first on a tie); ``(None, [])`` while
    no seed is shared by every candidate that has finished runs. ``cells``: label → seed → record."""
    candidates = [c for c in cells if fnmatch.fnmatchcase(c, choose["among"]) and cells[c]]
    shared = sorted(set.intersection(*(set(cells[c]) for c in candidates))) if candidates else []
    if not shared:
        return None, []
    by, sign = choose["by"], -1 if choose.get("lowest") else 1
    return max(candidates, key=lambda c: sign * statistics.mean(cells[c][s][at][by] for s in shared)), shared


def chosen_settings(label: str, spec: dict, source: list[RunSpec], records: dict, select: str | None,
                    by: str) -> tuple[list[dict], list[tuple[str, dict, str, tuple[str, ...]]]]:
    """The settings group ``label`` takes from its ``choose`` spec (``{group: SOURCE, per: FIELDS, lowest:}``):
    for each value of the ``per`` fields among SOURCE's runs ``source``, the setting (grid values) of the SOURCE
    run with the best mean validation ``by`` by :func:`choose`, each run read at its epoch selected by ``select``
    (the last without one). A choice is made once every SOURCE run it reads is finished (its run directory, else
    its committed record in ``records``); until then it is waiting (second value: group, per values, SOURCE, the
    runs not finished)."""
    per = [spec["per"]] if isinstance(spec.get("per"), str) else list(spec.get("per") or [])
    for f in per:
        if any(f not in r.values for r in source) or f == "seed":
            raise ConfigError(f"group {label!r}: 'per: {f}' is not a grid field of group {spec['group']!r} "
                              f"(fields: {', '.join(k for k in source[0].values if k != 'seed')})")
    at = "best" if select else "last"
    members: dict[tuple, list[RunSpec]] = {}
    for run in source:
        members.setdefault(tuple(_hashable(run.values[f]) for f in per), []).append(run)
    settings, waiting = [], []
    for group_runs in members.values():
        combos: list[dict] = []
        cells: dict[str, dict[int, dict]] = {}
        missing = []
        for run in group_runs:
            setting = {k: v for k, v in run.values.items() if k != "seed"}
            if setting not in combos:
                combos.append(setting)
            cell = cells.setdefault(str(combos.index(setting)), {})
            value = _validation_value(run, records.get(run.name), by, select)
            if value is _NOT_FINISHED:
                missing.append(run.name)
            elif value is not None:
                cell[run.values["seed"]] = {at: {by: value}}
        where = {f: group_runs[0].values[f] for f in per}
        if missing:
            waiting.append((label, where, spec["group"], tuple(missing)))
            continue
        best, _ = choose(cells, {"among": "*", "by": by, "lowest": bool(spec.get("lowest", False))}, at)
        if best is None:  # every candidate diverged, or no seed is shared: nothing to choose from
            waiting.append((label, where, spec["group"], ()))
            continue
        settings.append(combos[int(best)])
    return settings, waiting


_NOT_FINISHED = object()


def _hashable(value):
    return json.dumps(value, sort_keys=True) if isinstance(value, dict | list) else value


def _validation_value(run: RunSpec, record: dict | None, by: str, select: str | None):
    """``by`` of a finished run at its selected epoch (its run directory, else its committed ``record``); None for a
    diverged run or one without the metric; ``_NOT_FINISHED`` otherwise. A run step's value is in its
    ``result.json`` (a ``distill_lm`` run's ``val_*``), not under the names of its metrics log."""
    state = state_of(run) if run.run_dir.is_dir() else "new"
    if state == "diverged":
        return None
    if state == "finished" and run.step is not None:
        return json.loads((run.run_dir / RESULT_FILE).read_text()).get(by)
    if state == "finished":
        rows = read_committed_metrics(run.run_dir)
        if select:
            row = max((r for r in rows if select in r), key=lambda r: r[select], default=None)  # the first highest
        else:
            row = rows[-1] if rows else None
        return None if row is None else row.get(by)
    if record is not None:
        if "diverged" in record:
            return None
        return (record.get("best" if select else "last") or {}).get(by)
    return _NOT_FINISHED
