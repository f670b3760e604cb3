"""A study group whose setting is chosen on validation from an earlier group's runs (``choose``), the cells of the
chosen setting (``chosen_by``), and the summary's derived tables (``tables``): the rule, the waiting state, the
refusal of a choice on test, the resolution in one ``study run``, and the committed method table's choices (what
the replaced ``stage2.py`` wrote into its study file)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from scipy import stats

from conftest import TINY_RUN
from kdcollapse.cli import main
from kdcollapse.errors import ConfigError
from kdcollapse.study import load_study, summarise, write_page

ROOT = Path(__file__).resolve().parents[1]
TINY = "[" + ", ".join(json.dumps(o) for o in TINY_RUN) + "]"
STUDY = """
name: choose
seeds: [0]
define:
  common: &common TINY
groups:
  - group: grid
    run: "{key}/t{t}/seed{seed}"
    config: CONFIGS/kd.yaml
    grid:
      setting: [{key: a, t: 2}, {key: a, t: 4}, {key: b, t: 2}, {key: b, t: 4}]
    overrides: [*common, data.val_per_class=5, train.epochs=2, "optim.lr=0.0{t}"]
  - group: final
    run: "{key}/t{t}/seed{seed}"
    config: CONFIGS/kd.yaml
    seeds: [1]
    choose: {group: grid, per: key, by: val_acc}
    overrides: [*common, data.val_per_class=5, train.epochs=2, "optim.lr=0.0{t}"]
summary:
  metric: {metric: test_acc, at: best}
  sections:
    - title: chosen
      cells:
        - {label: "{key} (t = {t})", short: "{key}", group: final}
        - {label: "{key} (t = {t})", short: "{key}", group: grid, chosen_by: final}
      compare: [[b, a]]
"""


def write(tmp_path: Path, text: str = STUDY, records: dict | None = None) -> Path:
    path = tmp_path / "page" / "study.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "kd.yaml").write_text("method: {name: vanilla}\n")
    path.write_text(text.replace("TINY", TINY).replace("CONFIGS", str(tmp_path)))
    if records is not None:
        (path.parent / "runs.json").write_text(json.dumps(records))
    return path


def record(val, test):
    return {"best": {"val_acc": val, "test_acc": test}, "last": {"val_acc": val, "test_acc": test}}


def final(study) -> list[str]:
    return [name for name, run in study.runs.items() if run.group == "final"]


def test_a_choice_waits_for_every_run_it_reads_then_takes_the_best_validation_value(tmp_path, capsys):
    # a: only t = 2 finished -> a waits; b: both finished, t = 2 better on test but t = 4 on validation -> t = 4
    path = write(tmp_path, records={"a/t2/seed0": record(80, 70), "b/t2/seed0": record(50, 99),
                                    "b/t4/seed0": record(60, 10)})
    study = load_study(path, runs_dir=tmp_path / "runs")
    assert final(study) == ["b/t4/seed1"]
    assert study.waiting == (("final", {"key": "a"}, "grid", ("a/t4/seed0",)),)
    assert main(["study", "status", str(path), "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "waiting      group final (key=a): chosen on validation once 1 run(s) of group grid finish: a/t4/seed0" \
        in out and "1 choices waiting" in out
    # once a/t4 finished (a tie on validation: the first grid value), a resolves too; a diverged run is no candidate
    (path.parent / "runs.json").write_text(json.dumps({
        "a/t2/seed0": record(80, 70), "a/t4/seed0": record(80, 90), "b/t2/seed0": {"diverged": {"epoch": 1}},
        "b/t4/seed0": record(60, 10)}))
    study = load_study(path, runs_dir=tmp_path / "runs")
    assert final(study) == ["a/t2/seed1", "b/t4/seed1"] and study.waiting == ()


def test_the_chosen_cells_join_the_source_run_of_the_chosen_value(tmp_path):
    records = {"a/t2/seed0": record(80, 70), "a/t4/seed0": record(70, 90), "b/t2/seed0": record(50, 99),
               "b/t4/seed0": record(60, 10), "a/t2/seed1": record(81, 72), "b/t4/seed1": record(61, 13)}
    study = load_study(write(tmp_path, records=records), runs_dir=tmp_path / "runs")
    _, summary = summarise(study, records)
    assert summary["sections"][0]["cells"] == {"a (t = 2)": ["0,1", "71.00 ± 1.41"], "b (t = 4)": ["0,1", "11.50 ± 2.12"]}
    (c,) = summary["comparisons"]
    assert (c["a"], c["b"], c["per_seed"]) == ("b", "a", [-60, -59])



def test_a_page_of_partial_records_says_how_many_runs_finished_and_how_many_choices_wait(tmp_path):
    """summarise names what a page of a running study shows: the runs recorded of those defined, and the choices
    still waiting (more runs to come); a complete study's page has no such line."""
    partial = {"a/t2/seed0": record(80, 70), "b/t2/seed0": record(50, 99), "b/t4/seed0": record(60, 10)}
    text, _ = summarise(load_study(write(tmp_path, records=partial), runs_dir=tmp_path / "runs"), partial)
    assert ("**Partial records**: 3 of the 5 runs defined so far have finished; 1 choice(s) on validation still "
            "wait for the runs they read") in text and "`kdcollapse study status study.yaml`" in text
    complete = {**partial, "a/t4/seed0": record(70, 90), "a/t2/seed1": record(81, 72), "b/t4/seed1": record(61, 13)}
    study = load_study(write(tmp_path, records=complete), runs_dir=tmp_path / "runs")
    assert study.waiting == () and "Partial records" not in summarise(study, complete)[0]
    text, _ = summarise(study, {k: v for k, v in complete.items() if k != "b/t4/seed1"})
    assert "**Partial records**: 5 of the 6 runs defined so far have finished. A cell" in text

@pytest.mark.parametrize("change, message", [
    (("by: val_acc}", "by: test_acc}"), "validation metrics only"),
    (("choose: {group: grid,", "choose: {group: nowhere,"), "unknown group that group 'final' chooses from"),
    (("per: key,", "per: tag,"), "'per: tag' is not a grid field of group 'grid'"),
    (("choose: {group: grid,", "grid: {t: [2]}\n    choose: {group: grid,"), "no 'grid' of its own"),
    (("per: key, by", "per: key, among: x, by"), "'choose' is {group"),
])
def test_bad_choices_are_refused(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_study(write(tmp_path, STUDY.replace(*change)), runs_dir=tmp_path / "runs")


def test_a_choice_on_test_is_refused_even_through_the_summary_select(tmp_path):
    text = STUDY.replace(", by: val_acc}", "}").replace("summary:\n", "summary:\n  select: test_acc\n")
    with pytest.raises(ConfigError, match="validation metrics only"):
        load_study(write(tmp_path, text), runs_dir=tmp_path / "runs")


def test_one_study_run_trains_the_source_runs_then_the_chosen_ones(tmp_path, capsys):
    path = write(tmp_path, STUDY.replace(", {key: b, t: 2}, {key: b, t: 4}", ""))
    assert main(["study", "run", str(path), "--runs-dir", str(tmp_path / "runs")]) == 0
    out = capsys.readouterr().out
    assert "2 runs, 0 finished, 2 to do, 1 choices waiting" in out and "3 runs, 2 finished, 1 to do" in out
    study = load_study(path, runs_dir=tmp_path / "runs")
    records = json.loads((path.parent / "runs.json").read_text())
    best = max(["a/t2/seed0", "a/t4/seed0"], key=lambda n: records[n]["best"]["val_acc"])
    assert final(study) == [best.replace("seed0", "seed1")] and best.replace("seed0", "seed1") in records


K10 = ROOT / "results/distillation/method_table/study.yaml"
# the `final` group stage2.py wrote into the K = 10 study file from the committed stage-1 records (revision bb2e707)
STAGE2 = ["kd_t2", "dkd_b1", "binarykl_a0.5", "dhkd_a1", "ikl_kd_m4", "nkd_g0.5", "wttm_g0.2", "ctkd_t10", "mlkd_t2",
          "kd_ls_t2", "dkd_ls_t4", "ctkd_ls_t20", "mlkd_ls_t4", "rkd_w0.5", "fitnet_w0.5", "at_w0.5", "ofd_w0.5",
          "dist_w0.5", "nst_w0.5", "sp_w0.5", "pkt_w0.5", "crd_w1", "reviewkd_w2", "vid_w2"]


def test_the_k10_table_chooses_what_stage2_wrote_from_the_committed_records(tmp_path):
    study = load_study(K10, runs_dir=tmp_path / "no-runs")  # the committed records only
    chosen = [f"{r.values['key']}_{r.values['tag']}" for r in study.runs.values() if r.group == "final"]
    assert chosen == STAGE2 * 2 and study.waiting == ()
    assert [r.values["seed"] for r in study.runs.values() if r.group == "final"] == [1] * 24 + [2] * 24


TABLE = """
  tables:
    - name: overview
      sort: descending
      against: a
      header: [method, setting]
      columns:
        - {label: paper, values: {a: "1.0"}, missing: "?"}
        - {label: cost, table: cost.md, column: time vs a, rows: {b: b (defaults)}, missing: "—"}
        - {label: before, summary: old.json}
"""


def test_a_derived_table_sorts_the_cells_beside_their_comparisons(tmp_path):
    records = {"a/t2/seed0": record(80, 70), "a/t4/seed0": record(70, 90), "b/t2/seed0": record(50, 99),
               "b/t4/seed0": record(60, 10), "a/t2/seed1": record(81, 72), "b/t4/seed1": record(61, 13)}
    path = write(tmp_path, STUDY.replace("  sections:", TABLE + "  columns: [{metric: test_acc, at: best, label: acc}]\n"
                                         "  sections:"), records)
    (path.parent / "cost.md").write_text("# cost\n\n| method | time vs a |\n|---|---|\n| a | 1.00 |\n| b (defaults) "
                                         "| 2.50 |\n\n| method | time vs a |\n|---|---|\n| a | 9 |\n")
    (path.parent / "old.json").write_text(json.dumps({"sections": [{"cells": {"a (t = 4)": ["0,1", "5.00 ± 1.00"],
                                                                              "b (t = 4)": ["0,1", "6.00 ± 1.00"]}}]}))
    readme = path.parent / "README.md"
    readme.write_text("# page\n\n<!-- table overview: generated by `kdcollapse study report`, do not edit by hand -->\n"
                      "<!-- end of table overview -->\n\n<!-- study summary: generated by `kdcollapse study report`, "
                      "do not edit by hand -->\n<!-- end of study summary -->\n")
    write_page(load_study(path, runs_dir=tmp_path / "runs"))
    table = readme.read_text().split("do not edit by hand -->\n")[1].split("<!--")[0]
    p = stats.ttest_rel([10, 13], [70, 72]).pvalue
    assert table.splitlines() == [
        "| method | setting | acc | − a (pp) | Holm p | verdict | paper | cost | before |", "|---|---|---|---|---|---|---|---|---|",
        "| a | t = 2 | 71.00 ± 1.41 | — | — | — | 1.0 | 1.00 | 5.00 ± 1.00 (t = 4) |",
        f"| b | t = 4 | 11.50 ± 2.12 | -59.50 | {p:.3f} | worse | ? | 2.50 | 6.00 ± 1.00 |"]
    readme.write_text(readme.read_text().replace("<!-- end of table overview -->", ""))
    with pytest.raises(ConfigError, match="no markers for derived table 'overview'"):
        write_page(load_study(path, runs_dir=tmp_path / "runs"))


@pytest.mark.parametrize("change, message", [
    ("sort: descending", "unknown 'sort' of derived table 'overview'"),
    ("header: [method, setting]", "'header' is the titles of its first two columns"),
    ("against: a", "unknown key of derived table 'overview'"),
])
def test_bad_derived_tables_are_refused(tmp_path, change, message):
    bad = {"sort: descending": "sort: sideways", "header: [method, setting]": "header: [method]",
           "against: a": "against: a\n      colour: red"}[change]
    path = write(tmp_path, STUDY.replace("  sections:", TABLE.replace(change, bad) + "  sections:"), {})
    with pytest.raises(ConfigError, match=message):
        summarise(load_study(path, runs_dir=tmp_path / "runs"), {})
