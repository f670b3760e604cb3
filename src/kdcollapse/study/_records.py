"""A study's records (``runs.json`` beside the study file), its committed outputs: for each finished run, the
summary's metrics at its selected epoch ("best": the highest validation metric ``select``) and its last
(``select: null`` for runs without a validation split: the last epoch only, no epoch is selected) epoch.
:func:`collect` refreshes them from the run directories that are present; the page reads only them. A run
whose directory is gone keeps its record; committed copies of its ``metrics.jsonl`` (``history``) and of its
post steps' files (``reports``) may add what the plots need, each checked against the record."""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

from kdcollapse.errors import CheckpointError, ConfigError, unknown_choice
from kdcollapse.runs import metrics_source, outputs_stale, read_committed_metrics, read_metrics, run_state
from kdcollapse.study._runs import DIVERGED_FILE, POST_FIELD, RECORDS_FILE, RESULT_FILE, committed_records
from kdcollapse.study._spec import Study
from kdcollapse.study._summary_spec import check_summary, curve_keys, kept_keys, measures, record_keys


def epoch_series(rows: list[dict], keys) -> dict:
    """``{metric: [[epoch, value], ...]}`` of ``metrics.jsonl`` rows, for each of ``keys`` some row has (the epochs
    that evaluated it): a record's ``epochs``."""
    return {k: series for k in sorted(keys) if (series := [[r["epoch"], r[k]] for r in rows if k in r])}


def run_record(run_dir: Path, spec: dict, post: tuple = ()) -> dict:
    """The summary's numbers of one finished run: every column's metric at the selected and the last epoch;
    the numbers of its JSON post steps (``post``: their files) count as last-epoch metrics; ``source``: the
    committed epoch and the digests of the metrics and weights they were read from. A diverged run's record is
    ``{"diverged": {"epoch": E}}`` (E: the epoch it broke in) with its last good epoch as "last"."""
    diverged = (run_dir / DIVERGED_FILE).is_file() and run_state(run_dir) != "finished"
    # a finished run's records are checked against the SHA-256 that state.json records
    records = read_metrics(run_dir) if diverged else read_committed_metrics(run_dir)
    stale = outputs_stale(run_dir) if post else {}
    for f in post:
        if f in stale:  # computed from weights the run no longer holds
            raise CheckpointError(f"{run_dir / f} is stale: {stale[f]}; delete it and run the study again to redo "
                                  "the step")
    keys = record_keys(spec)
    extra = {k: v for f in post if f.endswith(".json") and (run_dir / f).is_file()
             for k, v in _flat_json(json.loads((run_dir / f).read_text()), _folder(f)).items() if k in keys}
    if records and (clash := sorted(set(extra) & set(records[-1]))):
        raise ConfigError(f"{run_dir}: post step output {', '.join(clash)} is also a metrics.jsonl key; a summary "
                          "column would not know which to read")
    if diverged:
        broke = {"epoch": json.loads((run_dir / DIVERGED_FILE).read_text())["epoch"]}
        last = {"epoch": records[-1]["epoch"], **{k: records[-1][k] for k in sorted(keys) if k in records[-1]}} \
            if records else {}
        return {"diverged": broke, **({"last": {**last, **extra}} if records else {})}
    chosen = [("last", records[-1])]
    if spec["select"]:
        evaluated = [r for r in records if spec["select"] in r]  # every epoch, or every eval_every-th and the last
        chosen.insert(0, ("best", max(evaluated, key=lambda r: r[spec["select"]])))  # the first highest epoch
    ats = {m.at for m in measures(spec)}
    if "first" in ats:
        chosen.append(("first", records[0]))
    record = {at: {"epoch": r["epoch"], **{k: r[k] for k in sorted(keys) if k in r}, **(extra if at == "last" else {})}
              for at, r in chosen}
    if "falls" in ats:
        falls = {m.metric for m in measures(spec) if m.at == "falls"}
        record["falls"] = {k: sum(b < a for a, b in zip(series, series[1:]))
                           for k in sorted(falls) if (series := [r[k] for r in records if k in r])}
    if curves := curve_keys(spec):  # opt-in: only the metrics a curves plot draws
        record["epochs"] = epoch_series(records, curves)
    for field, keys in kept_keys(spec).items():  # opt-in: only the matrices and embeddings plots draw
        record[field] = {k: m for k in keys if (m := _post_matrix(run_dir, post, k)) is not None}
    return record | {"source": metrics_source(run_dir)} | _hardware(run_dir) | measured(run_dir, post)


def measured(run_dir: Path, post: tuple) -> dict:
    """``{"post": [...]}``: the post steps' files (of ``post``) the run directory holds, whose numbers the record
    has: a committed record lacking one of its run's post files (or this field) does not make the run "recorded"
    (:func:`kdcollapse.study.recorded`); ``{}`` for a run without post steps."""
    return {POST_FIELD: sorted(f for f in post if (Path(run_dir) / f).is_file())} if post else {}


def _hardware(run_dir: Path) -> dict:
    """``{"hardware": ...}``: what ``run.json`` says the run was made on (CPU model and capability, GPU, torch and
    CUDA versions), for the page to name; ``{}`` for a run recorded before run.json kept it."""
    try:
        hardware = json.loads((run_dir / "run.json").read_text()).get("hardware")
    except (OSError, ValueError):
        return {}
    return {"hardware": hardware} if isinstance(hardware, dict) else {}


def _folder(path: str) -> str:
    """The folder of a post step's file inside the run directory ("" for a file at its top): the prefix of its keys,
    so that ``analysis_test/analysis.json`` and ``analysis_train/analysis.json`` give ``analysis_test/metrics/nc1``
    and ``analysis_train/metrics/nc1``."""
    parent = Path(path).parent.as_posix()
    return "" if parent == "." else parent


def _flat_json(value, prefix: str = "") -> dict:
    """A post step's JSON as ``{key: number}``: nested mappings and lists joined with ``/`` (``robust_eval.json``'s
    ``"pgd-20 Linf eps=0.1 last/robust_accuracy"``, ``".../stages/1/robust_accuracy"``); top-level keys as they are."""
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return {prefix: value}
    return {k: v for key, item in items for k, v in _flat_json(item, f"{prefix}/{key}" if prefix else str(key)).items()}


def collect(study: Study) -> dict[str, dict]:
    """The committed records (``runs.json`` beside the study file), refreshed from every finished (or
    diverged) run of the summary's groups present under the study's ``runs_dir``; runs not named by the study
    are dropped."""
    spec = check_summary(study.summary)
    records = committed_records(study.path)
    groups = {cell["group"] for section in spec.get("sections") or [] for cell in section.get("cells") or []}
    refreshed = set()
    for name, run in study.runs.items():
        if run.group not in groups:
            continue
        if run.step is not None:
            if (run.run_dir / RESULT_FILE).is_file():
                stale = outputs_stale(run.run_dir) if run.post else {}
                for step in run.post:
                    if step.creates in stale:  # measured on weights the run no longer holds
                        raise CheckpointError(f"{run.run_dir / step.creates} is stale: {stale[step.creates]}; delete "
                                              "it and run the study again to redo the step")
                result = json.loads((run.run_dir / RESULT_FILE).read_text())
                keys = record_keys(spec)
                extra = {k: v for step in run.post if (run.run_dir / step.creates).is_file()
                         for k, v in _flat_json(json.loads((run.run_dir / step.creates).read_text()),
                                                _folder(step.creates)).items() if k in keys}  # its post steps'
                records[name] = {"last": {k: result[k] for k in sorted(keys) if k in result} | extra} | measured(
                    run.run_dir, tuple(step.creates for step in run.post)) | _hardware(run.run_dir)
        elif (state := run_state(run.run_dir)) in ("finished", "new", "interrupted") and (
                state == "finished" or (run.run_dir / DIVERGED_FILE).is_file()):
            records[name] = run_record(run.run_dir, spec, tuple(step.creates for step in run.post))
            refreshed.add(name)
        elif name in records and _moved_on(records[name], Path(run.run_dir)):
            warnings.warn(f"study {study.name}: left out the record of run {name}: {run.run_dir} no longer holds the "
                          "weights it was read from (overwritten, or trained further); it returns when that run "
                          "finishes", stacklevel=2)
            del records[name]
    if spec.get("reports") is not None and (kept := kept_keys(spec)):
        for name in (n for n in study.runs if n in records and n not in refreshed):
            if copies := _report_files(study, spec["reports"], name):
                records[name] = with_reports(records[name], copies, kept, study.path.parent)
    if spec.get("history") is not None and (curves := curve_keys(spec)):
        for name in (n for n in study.runs if n in records and n not in refreshed):
            if (copy := _history_file(study, spec["history"], name)) is not None:
                records[name] = with_history(records[name], copy, curves, study.path.parent)
    return {name: records[name] for name in study.runs if name in records}


def _history_file(study: Study, history, name: str) -> Path | None:
    """The committed copy of run ``name``'s ``metrics.jsonl`` that the summary's ``history`` names (a template
    with ``{run}`` and the run's fields, or a mapping run → file; relative to the study file), if it exists."""
    if isinstance(history, str):
        try:
            relative = history.format(run=name, **study.runs[name].values)
        except (KeyError, IndexError, ValueError):
            raise ConfigError(f"summary 'history' {history!r}: a template of {{run}} and the run's fields "
                              f"({', '.join(sorted(study.runs[name].values))}), for run {name!r}") from None
    elif isinstance(history, dict) and all(isinstance(v, str) for v in history.values()):
        if unknown := sorted(set(history) - set(study.runs)):
            raise ConfigError(unknown_choice("run of summary 'history'", unknown[0], tuple(study.runs)))
        relative = history.get(name)
    else:
        raise ConfigError(f"summary 'history' is a file template (e.g. 'metrics/{{run}}.jsonl') or a mapping run → "
                          f"file, got {history!r}")
    path = study.path.parent / relative if relative else None
    return path if path is not None and path.is_file() else None


def with_history(record: dict, copy: Path, keys, root: Path) -> dict:
    """``record`` with the per-epoch series of ``keys`` (``epochs``) read from ``copy``, a committed copy of its
    run's ``metrics.jsonl`` for a run whose directory is gone, and ``epochs_source``: that file (relative to
    ``root``) and its SHA-256. The copy must be the run's: the digest its record's ``source`` names, where it names
    one, and its last epoch equal to the record's last epoch in every number both hold; otherwise it is refused."""

    data = copy.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    rows = [json.loads(line) for line in data.decode().splitlines() if line.strip()]
    recorded = (record.get("source") or {}).get("metrics_sha256")
    if recorded is not None and recorded != digest:
        raise CheckpointError(f"{copy} is not the metrics.jsonl its record was read from (SHA-256 {digest[:12]}…, "
                              f"the record's {recorded[:12]}…)")
    last, final = record.get("last") or {}, rows[-1] if rows else {}
    if (differ := [k for k in sorted(last) if k in final and final[k] != last[k]]) or "epoch" not in final:
        raise ConfigError(f"{copy} is not this run's history: its last epoch differs from the record's last epoch in "
                          f"{', '.join(differ) or 'epoch (none logged)'}")
    return {**record, "epochs": epoch_series(rows, keys),
            "epochs_source": {"file": copy.relative_to(root).as_posix(), "sha256": digest}}


def _json_path(value, parts: list[str]):
    for part in parts:
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            return None
    return value


def _in_post_file(post_file: str, data, key: str):
    """The value at ``key`` (``FOLDER/path/in/the/json``, as the records name a post step's numbers) of the JSON
    ``data`` of post file ``post_file``, or None when the key is not one of its."""
    folder = _folder(post_file)
    if folder and not key.startswith(folder + "/"):
        return None
    return _json_path(data, key.removeprefix(folder + "/" if folder else "").split("/"))


def _post_matrix(run_dir: Path, post: tuple, key: str):
    for f in (f for f in post if f.endswith(".json") and (run_dir / f).is_file()):
        if (value := _in_post_file(f, json.loads((run_dir / f).read_text()), key)) is not None:
            return value
    return None


def _report_files(study: Study, reports, name: str) -> dict[str, Path]:
    """Post file → its committed copy, for run ``name``, as the summary's ``reports`` names them
    (``{run: {POST_FILE: COPY}}``, copies relative to the study file); the copies that exist."""
    if not isinstance(reports, dict) or not all(isinstance(v, dict) for v in reports.values()):
        raise ConfigError(f"summary 'reports' is a mapping run → {{post file: committed copy}}, got {reports!r}")
    if unknown := sorted(set(reports) - set(study.runs)):
        raise ConfigError(unknown_choice("run of summary 'reports'", unknown[0], tuple(study.runs)))
    posts = {step.creates for step in study.runs[name].post}
    if bad := sorted(set(reports.get(name, {})) - posts):
        raise ConfigError(unknown_choice(f"post file of run {name!r} in summary 'reports'", bad[0],
                                         tuple(sorted(posts))))
    return {f: study.path.parent / c for f, c in reports.get(name, {}).items() if (study.path.parent / c).is_file()}


def with_reports(record: dict, copies: dict[str, Path], kept: dict[str, list[str]], root: Path) -> dict:
    """``record`` with the values of ``kept`` (record field → post-step keys: ``matrices``, ``embeddings``) read from
    ``copies`` (post file → a committed copy of it, for a run whose directory is gone) and, per field,
    ``FIELD_source`` (post file → the copy and its SHA-256). Each copy must hold the numbers of the record's last
    epoch that are its keys, equal; otherwise it is refused."""

    values: dict[str, dict] = {field: {} for field in kept}
    sources = {}
    for post_file, copy in copies.items():
        data = json.loads(copy.read_bytes())
        flat = _flat_json(data, _folder(post_file))
        last = record.get("last") or {}
        if differ := [k for k in sorted(last) if k in flat and flat[k] != last[k]]:
            raise ConfigError(f"{copy} is not this run's {post_file}: it differs from the record in "
                              f"{', '.join(differ)}")
        for field, keys in kept.items():
            values[field] |= {k: v for k in keys if (v := _in_post_file(post_file, data, k)) is not None}
        sources[post_file] = {"file": copy.relative_to(root).as_posix(),
                              "sha256": hashlib.sha256(copy.read_bytes()).hexdigest()}
    return {**record, **{k: v for field in kept for k, v in ((field, values[field]), (f"{field}_source", sources))}}


def _moved_on(record: dict, run_dir: Path) -> bool:
    """Whether ``run_dir`` exists and holds other weights than the committed ``record`` was read from (records
    written before they named their source are kept)."""
    recorded = (record.get("source") or {}).get("weights_sha256")
    return recorded is not None and run_dir.is_dir() and metrics_source(run_dir)["weights_sha256"] != recorded
