"""Per-epoch series in a study's records for runs whose directories are gone: read from the committed copies of
their ``metrics.jsonl`` that the summary's ``history`` names, checked against the run's record, with the copy
and its digest as provenance; and the curves drawn from them (mean ± std over the seeds at each epoch)."""

from __future__ import annotations

import hashlib
import json
import math
import statistics

import pytest

from kdcollapse.errors import CheckpointError, ConfigError
from kdcollapse.study import collect, figures, load_study
from kdcollapse.study._figures import _curve_panels
from kdcollapse.study._records import epoch_series
from kdcollapse.study._summary_spec import check_summary

STUDY = """
name: history
seeds: [0, 1]
groups:
  - group: g
    run: x{x}/seed{seed}
    config: CONFIG
    grid: {x: [1, 2]}
summary:
  select: null
  metric: {metric: acc, label: acc}
  columns: [{metric: acc, label: acc (%)}]
  HISTORY
  sections:
    - title: grid
      cells: [{label: "x = {x}", group: g}]
  plots: [{file: c.png, kind: curves, section: grid, metrics: [acc, loss]}]
"""


def rows(x: int, seed: int) -> list[dict]:
    """A run's metrics.jsonl: three epochs; loss is logged but no column of the page."""
    return [{"epoch": e, "acc": 40.0 + 10 * e + x + 0.5 * seed * e, "loss": 1.0 / (e + x + seed)} for e in (1, 2, 3)]


def write_copy(path, x: int, seed: int) -> bytes:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = "".join(json.dumps(r) + "\n" for r in rows(x, seed)).encode()
    path.write_bytes(data)
    return data


def make(tmp_path, history: str = 'history: "metrics/{run}.jsonl"', records: dict | None = None):
    (tmp_path / "c.yaml").write_text("method: {name: vanilla}\n")
    page = tmp_path / "page"
    page.mkdir(exist_ok=True)
    (page / "study.yaml").write_text(STUDY.replace("CONFIG", str(tmp_path / "c.yaml")).replace("HISTORY", history))
    for x in (1, 2):
        for s in (0, 1):
            write_copy(page / "metrics" / f"x{x}" / f"seed{s}.jsonl", x, s)
    records = records or {f"x{x}/seed{s}": {"last": {"epoch": 3, "acc": rows(x, s)[-1]["acc"]}}
                          for x in (1, 2) for s in (0, 1)}
    (page / "runs.json").write_text(json.dumps(records))
    return load_study(page / "study.yaml", runs_dir=tmp_path / "gone")


def test_a_record_s_history_is_its_copy_of_metrics_jsonl_with_the_copy_as_provenance(tmp_path):
    study = make(tmp_path)
    records = collect(study)
    for x in (1, 2):
        for s in (0, 1):
            record, copy = records[f"x{x}/seed{s}"], study.path.parent / "metrics" / f"x{x}" / f"seed{s}.jsonl"
            assert record["epochs"] == {k: [[r["epoch"], r[k]] for r in rows(x, s)] for k in ("acc", "loss")}
            assert record["epochs"] == epoch_series(rows(x, s), ["acc", "loss"])
            assert record["epochs_source"] == {"file": f"metrics/x{x}/seed{s}.jsonl",
                                               "sha256": hashlib.sha256(copy.read_bytes()).hexdigest()}
            assert record["last"] == {"epoch": 3, "acc": rows(x, s)[-1]["acc"]}  # the record itself is kept


def test_a_mapping_names_the_copies_run_by_run(tmp_path):
    study = make(tmp_path, 'history: {x1/seed0: metrics/x1/seed0.jsonl}')
    records = collect(study)
    assert "epochs" in records["x1/seed0"] and "epochs" not in records["x1/seed1"]
    with pytest.raises(ConfigError, match="keep no per-epoch acc"):
        figures(study, records)  # x1/seed1 has no history


def test_a_copy_that_is_not_the_run_s_is_refused(tmp_path):
    records = {f"x{x}/seed{s}": {"last": {"epoch": 3, "acc": rows(x, s)[-1]["acc"]}} for x in (1, 2) for s in (0, 1)}
    records["x2/seed1"]["last"]["acc"] += 0.01
    with pytest.raises(ConfigError, match="differs from the record's last epoch in acc"):
        collect(make(tmp_path, records=records))
    records["x2/seed1"]["last"]["acc"] -= 0.01
    records["x2/seed1"]["last"]["epoch"] = 4
    with pytest.raises(ConfigError, match="in epoch"):
        collect(make(tmp_path, records=records))
    records["x2/seed1"]["last"]["epoch"] = 3
    records["x2/seed1"]["source"] = {"metrics_sha256": "0" * 64}  # the digest state.json recorded for the run
    with pytest.raises(CheckpointError, match="not the metrics.jsonl its record was read from"):
        collect(make(tmp_path, records=records))
    for bad in ('history: 3', 'history: "metrics/{nope}.jsonl"', 'history: {x9/seed0: a.jsonl}'):
        with pytest.raises(ConfigError, match="history"):
            collect(make(tmp_path, bad))


def test_a_curve_over_two_seeds_is_their_mean_and_std_at_each_epoch(tmp_path):
    study = make(tmp_path)
    records = collect(study)
    spec = check_summary(study.summary)
    acc, loss = _curve_panels(study, records, spec, spec["sections"][0], spec["plots"][0])
    assert [acc["title"], loss["title"]] == ["acc (%)", "loss"]  # loss is no column: drawn under its name
    plot = {**spec["plots"][0], "labels": ["accuracy", "train loss"]}
    assert [p["title"] for p in _curve_panels(study, records, spec, spec["sections"][0], plot)] == \
        ["accuracy", "train loss"]
    with pytest.raises(ConfigError, match="'labels' names each metric's panel"):
        _curve_panels(study, records, spec, spec["sections"][0], {**plot, "labels": ["one"]})
    for x, series in zip((1, 2), acc["series"]):
        a, b = rows(x, 0), rows(x, 1)
        assert series["label"] == f"x = {x} (2 seeds)" and series["x"] == [1, 2, 3]
        assert series["y"] == [(u["acc"] + v["acc"]) / 2 for u, v in zip(a, b)]
        assert series["yerr"] == pytest.approx([abs(u["acc"] - v["acc"]) / math.sqrt(2) for u, v in zip(a, b)])
        assert series["yerr"] == [statistics.stdev([u["acc"], v["acc"]]) for u, v in zip(a, b)]
    pytest.importorskip("matplotlib")
    assert figures(study, records)["c.png"].startswith(b"\x89PNG")


def test_a_seeds_column_lists_each_seed_s_value_in_seed_order(tmp_path):
    from kdcollapse.study import summarise

    study = make(tmp_path)
    study.summary["columns"] = [{"metric": "acc", "label": "acc, each seed", "seeds": True, "digits": 1},
                                {"metric": "acc", "label": "acc"}]
    records = {f"x{x}/seed{s}": {"last": {"epoch": 3, "acc": 50.0 + 10 * x - 3 * s}} for x in (1, 2) for s in (1, 0)}
    text, summary = summarise(study, records)
    assert "| x = 1 | 0,1 | 60.0, 57.0 | 58.50 ± 2.12 |" in text
    assert summary["sections"][0]["cells"]["x = 2"] == ["0,1", "70.0, 67.0", "68.50 ± 2.12"]
    study.summary["columns"][0]["seeds"] = "yes"
    with pytest.raises(ConfigError, match="'seeds' is true or false, got 'yes'"):
        summarise(study, records)


POST = "    post: [{command: analyze, args: [--split, test], creates: analysis_test/analysis.json}]\n"
MATRICES = STUDY.replace("    grid: {x: [1, 2]}\n", "    grid: {x: [1, 2]}\n" + POST).replace(
    "  plots: [{file: c.png, kind: curves, section: grid, metrics: [acc, loss]}]",
    "  plots: [{file: m.png, kind: matrices, section: grid, matrices: [analysis_test/logit_matrices/main/matrix, "
    "analysis_test/logit_matrices/aux/matrix], labels: [main, aux]}]")


def matrix(x: int, seed: int) -> list[list[float]]:
    return [[(i - j) * (x + seed) + 0.5 * (i == j) for j in range(3)] for i in range(3)]


def test_a_matrices_plot_draws_each_cell_s_mean_abs_matrix_from_the_committed_reports(tmp_path):
    (tmp_path / "c.yaml").write_text("method: {name: vanilla}\n")
    page = tmp_path / "page"
    page.mkdir()
    reports = "\n".join(f"    x{x}/seed{s}: {{analysis_test/analysis.json: json/x{x}_{s}.json}}"
                        for x in (1, 2) for s in (0, 1))
    (page / "study.yaml").write_text(MATRICES.replace("CONFIG", str(tmp_path / "c.yaml")).replace(
        "HISTORY", "reports:\n" + reports))
    (page / "json").mkdir()
    for x in (1, 2):
        for s in (0, 1):
            heads = {"main": {"matrix": matrix(x, s)}} | ({"aux": {"matrix": matrix(0, s)}} if x == 2 else {})
            report = {"metrics": {"nc1": x + s}, "logit_matrices": heads}
            (page / "json" / f"x{x}_{s}.json").write_text(json.dumps(report))
    records = {f"x{x}/seed{s}": {"last": {"epoch": 3, "acc": 50.0, "analysis_test/metrics/nc1": x + s}}
               for x in (1, 2) for s in (0, 1)}
    (page / "runs.json").write_text(json.dumps(records))
    study = load_study(page / "study.yaml", runs_dir=tmp_path / "gone")
    collected = collect(study)
    assert collected["x2/seed1"]["matrices"] == {"analysis_test/logit_matrices/main/matrix": matrix(2, 1),
                                                 "analysis_test/logit_matrices/aux/matrix": matrix(0, 1)}
    assert collected["x1/seed0"]["matrices_source"]["analysis_test/analysis.json"]["file"] == "json/x1_0.json"
    from kdcollapse.study._figures import _matrix_panels

    spec = check_summary(study.summary)
    panels = _matrix_panels(study, collected, spec["sections"][0], spec["plots"][0])
    assert [p["title"].split(":")[0] for p in panels] == ["x = 1, main", "x = 2, main", "x = 2, aux"]
    for p, (x, head) in zip(panels, ((1, None), (2, None), (2, 0))):
        a, b = (matrix(x if head is None else head, s) for s in (0, 1))
        expected = [[0.0 if i == j else (abs(a[i][j]) + abs(b[i][j])) / 2 for j in range(3)] for i in range(3)]
        assert [v for r in p["matrix"] for v in r] == pytest.approx([v for r in expected for v in r])
        off = statistics.mean(v for i, r in enumerate(expected) for j, v in enumerate(r) if i != j)
        assert p["title"].endswith(f"mean {off:.3f} (2 seeds)")
    assert {p["vmax"] for p in panels} == {max(max(r) for p in panels for r in p["matrix"])}  # one colour scale
    pytest.importorskip("matplotlib")
    assert figures(study, collected)["m.png"].startswith(b"\x89PNG")
    records["x1/seed1"]["last"]["analysis_test/metrics/nc1"] = 9.0  # the copy is not this run's analysis
    (page / "runs.json").write_text(json.dumps(records))
    with pytest.raises(ConfigError, match="differs from the record in analysis_test/metrics/nc1"):
        collect(study)


EMBEDDINGS = MATRICES.replace(
    "  plots: [{file: m.png, kind: matrices, section: grid, matrices: [analysis_test/logit_matrices/main/matrix, "
    "analysis_test/logit_matrices/aux/matrix], labels: [main, aux]}]",
    "  plots: [{file: t.png, kind: embeddings, section: grid, embedding: analysis_test/tsne, cells: \"x = *\"}]")


def embedding(x: int, seed: int) -> dict:
    """What `analyze --tsne-per-class 2` keeps of a t-SNE of classes 0 and 2: 4 points, each its own position."""
    labels = [0, 0, 2, 2]
    return {"classes": [0, 2], "class_names": ["zero", "two"], "points": 4, "index": [3, 1, 0, 2], "labels": labels,
            "embedding": [[10 * x + i, -seed - i * i] for i in range(4)]}


def test_an_embeddings_plot_draws_each_cell_s_lowest_seed_from_the_committed_reports(tmp_path):
    from kdcollapse.study._figures import _embedding_panels

    (tmp_path / "c.yaml").write_text("method: {name: vanilla}\n")
    page = tmp_path / "page"
    (page / "json").mkdir(parents=True)
    reports = "\n".join(f"    x{x}/seed{s}: {{analysis_test/analysis.json: json/x{x}_{s}.json}}"
                        for x in (1, 2) for s in (0, 1) if (x, s) != (2, 0))  # none named for x2/seed0
    (page / "study.yaml").write_text(EMBEDDINGS.replace("CONFIG", str(tmp_path / "c.yaml")).replace(
        "HISTORY", "reports:\n" + reports))
    for x in (1, 2):
        for s in (0, 1):
            (page / "json" / f"x{x}_{s}.json").write_text(json.dumps({"metrics": {"nc1": x + s},
                                                                       "tsne": embedding(x, s)}))
    records = {f"x{x}/seed{s}": {"last": {"epoch": 3, "acc": 50.0, "analysis_test/metrics/nc1": x + s}}
               for x in (1, 2) for s in (0, 1)}
    (page / "runs.json").write_text(json.dumps(records))
    study = load_study(page / "study.yaml", runs_dir=tmp_path / "gone")
    collected = collect(study)
    assert collected["x1/seed1"]["embeddings"] == {"analysis_test/tsne": embedding(1, 1)}
    assert "embeddings" not in collected["x2/seed0"] and "matrices" not in collected["x1/seed1"]
    copy = page / "json" / "x1_0.json"
    assert collected["x1/seed0"]["embeddings_source"] == {"analysis_test/analysis.json": {
        "file": "json/x1_0.json", "sha256": hashlib.sha256(copy.read_bytes()).hexdigest()}}
    spec = check_summary(study.summary)
    one, two = _embedding_panels(study, collected, spec["sections"][0], spec["plots"][0])
    assert [one["title"], two["title"]] == ["x = 1 (seed 0)", "x = 2 (seed 1)"]  # x = 2: the lowest seed holding one
    for panel, (x, s) in ((one, (1, 0)), (two, (2, 1))):
        points = embedding(x, s)["embedding"]
        assert [(c["label"], c["color"], c["x"], c["y"]) for c in panel["series"]] == [
            ("zero", "C0", [points[0][0], points[1][0]], [points[0][1], points[1][1]]),
            ("two", "C1", [points[2][0], points[3][0]], [points[2][1], points[3][1]])]
    assert (one["legend"], two["legend"]) == (False, "outside")  # one legend for the figure
    pytest.importorskip("matplotlib")
    assert figures(study, collected)["t.png"].startswith(b"\x89PNG")
    del collected["x2/seed1"]["embeddings"]  # no run of cell x = 2 holds one now
    with pytest.raises(ConfigError, match="no run of cell 'x = 2' of section 'grid' holds analysis_test/tsne"):
        _embedding_panels(study, collected, spec["sections"][0], spec["plots"][0])
    collected["x1/seed0"]["embeddings"]["analysis_test/tsne"]["labels"] = [0, 0, 2, 5]  # a label of no class
    with pytest.raises(ConfigError, match="labels outside its classes"):
        _embedding_panels(study, collected, spec["sections"][0], {**spec["plots"][0], "cells": "x = 1"})
