"""Study runs beyond "finished": a diverged run is a recorded result (its state, its record, the page's
column, the comparisons that leave it out, later launches that leave it alone), and registered post steps
(the largest logit) whose numbers join a run's last-epoch record."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN
from kdcollapse.errors import ConfigError
from kdcollapse.runs import Run
from kdcollapse.study import (check_summary, collect, load_study, pending, run_local, run_record, state_of, status,
                              summarise, write_page)

TINY = "[" + ", ".join(json.dumps(o) for o in TINY_RUN) + "]"
STUDY = """
name: steps
seeds: [0, 1]
groups:
  - group: plain
    run: lr{lr}/seed{seed}
    config: CONFIGS/plain.yaml
    grid: {lr: [0.05, 1.0e+30]}
    overrides: [TINY, data.val_per_class=5, train.epochs=2, "optim.lr={lr}"]
    post: [{step: max_logit, creates: max_logit.json}]
summary:
  metric: {metric: test_acc, at: best}
  columns: [{metric: test_acc, at: best}, {metric: max_logit, at: last, label: largest logit}]
  sections:
    - title: lr
      cells: [{label: "lr {lr}", group: plain}]
      compare: [["lr 0.05", "lr 1e+30"]]
"""


def write_study(tmp_path: Path, text: str = STUDY) -> Path:
    (tmp_path / "plain.yaml").write_text("method: {name: vanilla}\n")
    path = tmp_path / "page" / "study.yaml"
    path.parent.mkdir()
    path.write_text(text.replace("TINY", TINY).replace("CONFIGS", str(tmp_path)))
    return path


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("steps")
    study = load_study(write_study(tmp), runs_dir=tmp / "runs")
    return study, run_local(study, pending(study), workers=2)


def test_a_diverged_run_is_recorded_reported_and_left_alone(ran):
    study, outcomes = ran
    by_name = {o.name: o.status for o in outcomes}
    assert by_name == {"lr0.05/seed0": "finished", "lr0.05/seed1": "finished",
                       "lr1e+30/seed0": "diverged", "lr1e+30/seed1": "diverged"}
    broke = study.runs["lr1e+30/seed0"]
    assert json.loads((broke.run_dir / "diverged.json").read_text())["epoch"] == 1  # nothing was committed
    assert state_of(broke) == "diverged" and status(study)["lr1e+30/seed1"] == "diverged"
    assert pending(study) == []  # a later launch does not train it again
    records = collect(study)
    assert records["lr1e+30/seed0"] == {"diverged": {"epoch": 1}}
    text, summary = summarise(study, records)
    assert "| lr 1e+30 |  | – | – | seed 0: N.A.(1), seed 1: N.A.(1) |" in text
    (c,) = summary["comparisons"]
    assert c["seeds"] == [] and c["verdict"] == "not tested"  # no seed finished in both cells


@torch.no_grad()
def test_the_max_logit_step_joins_the_last_epoch_record(ran):
    study, _ = ran
    run = study.runs["lr0.05/seed1"]
    model, _ = Run(run.run_dir).model()
    model.eval()
    val = Run(run.run_dir).dataset("val")  # digits: uint8 vectors, scaled to [0, 1] then normalised
    x = (val.inputs.float() / 255 - torch.tensor(val.mean)) / torch.tensor(val.std)
    expected = model(x).max().item()
    record = collect(study)["lr0.05/seed1"]
    assert record["last"]["max_logit"] == pytest.approx(expected, rel=1e-6)
    assert "max_logit" not in record["best"]


def test_a_post_step_output_is_the_runs_derived_output_and_goes_with_overwrite(ran, tmp_path):
    """Written under the run's lock and listed in its outputs.json with the weights it measured: flagged once
    the weights change, removed by --overwrite, so the step is done again for the new weights (issue 28)."""
    import shutil

    from kdcollapse.cli import main
    from kdcollapse.runs import source_of

    study, _ = ran
    run_dir = tmp_path / "run"
    shutil.copytree(study.runs["lr0.05/seed0"].run_dir, run_dir)
    listed = json.loads((run_dir / "outputs.json").read_text())["max_logit.json"]
    original = study.runs["lr0.05/seed0"].run_dir
    assert listed["source"]["weights_sha256"] == source_of(original)["weights_sha256"]
    assert main(["train", "--resume", str(run_dir), "train.epochs=3", "--quiet"]) == 0
    assert "max_logit.json" in Run(run_dir).stale_outputs()
    from kdcollapse.errors import CheckpointError
    from kdcollapse.study import run_record

    spec = {"metric": "test_acc", "select": None, "columns": [{"metric": "max_logit", "at": "last"}]}
    with pytest.raises(CheckpointError, match=r"max_logit\.json is stale: .*other weights"):
        run_record(run_dir, spec, ("max_logit.json",))  # the summary never joins a number of other weights
    assert main(["train", "--config", str(run_dir / "config.yaml"), f"run_dir={run_dir}", "--overwrite",
                 "--quiet"]) == 0
    assert not (run_dir / "max_logit.json").exists() and not (run_dir / "outputs.json").exists()


@pytest.mark.parametrize("post, message", [
    ("[{step: nothing, creates: x.json}]", "nothing"),
    ("[{step: max_logit, creates: x.txt}]", "must end in .json"),
    ("[{step: max_logit, command: analyze, creates: x.json}]", "a post step is"),
])
def test_bad_post_steps_are_refused(tmp_path, post, message):
    text = STUDY.replace("[{step: max_logit, creates: max_logit.json}]", post)
    with pytest.raises(ConfigError, match=message):
        load_study(write_study(tmp_path, text))


LAST_ONLY = STUDY.replace("""summary:
  metric: {metric: test_acc, at: best}
  columns: [{metric: test_acc, at: best}, {metric: max_logit, at: last, label: largest logit}]""", """summary:
  select: null
  metric: {metric: test_acc, at: last}
  columns: [{metric: test_acc}]""").replace("""      cells: [{label: "lr {lr}", group: plain}]""", """      columns: [{metric: test_acc, label: acc}, {metric: max_logit, digits: 4, label: largest logit}]
      cells: [{label: "lr {lr}", group: plain}]""")


def test_a_summary_without_selection_reads_last_epochs_with_section_columns(tmp_path):
    study = load_study(write_study(tmp_path, LAST_ONLY), runs_dir=tmp_path / "runs")
    records = {f"lr0.05/seed{s}": {"last": {"test_acc": 80.0 + s, "max_logit": 3.14159 + s}} for s in (0, 1)}
    records |= {f"lr1e+30/seed{s}": {"last": {"test_acc": 70.0 + 2 * s, "max_logit": 1.0}} for s in (0, 1)}
    text, summary = summarise(study, records)
    assert "each run read at its last epoch (no epoch is selected)" in text
    assert "| setting | seeds | acc | largest logit |" in text and "| lr 0.05 | 0,1 | 80.50 ± 0.71 | 3.6416 ± 0.7071 |" in text
    assert summary["comparisons"][0]["per_seed"] == [10.0, 9.0]


@pytest.mark.parametrize("lowest, chosen", [(False, "lr 0.05"), (True, "lr 1e+30")])
def test_a_summary_without_selection_chooses_on_the_last_validation_value(tmp_path, lowest, chosen):
    """Runs without epochs to select (run steps such as distill_lm) are chosen on their last validation number;
    ``lowest`` chooses the smallest (a perplexity)."""
    text = LAST_ONLY.replace("cells: [", f"choose: {{among: '*', by: val_ppl, lowest: {str(lowest).lower()}}}\n      cells: [")
    study = load_study(write_study(tmp_path, text), runs_dir=tmp_path / "runs")
    records = {f"lr0.05/seed{s}": {"last": {"test_acc": 80.0 + s, "max_logit": 1.0, "val_ppl": 50.0 + s}} for s in (0, 1)}
    records |= {f"lr1e+30/seed{s}": {"last": {"test_acc": 70.0 + 2 * s, "max_logit": 1.0, "val_ppl": 20.0}} for s in (0, 1)}
    text, _ = summarise(study, records)
    assert f"chosen on validation (val_ppl, seeds 0,1): {chosen}" in text and f"| {chosen} (chosen on val) |" in text


def test_a_record_without_its_post_steps_numbers_is_trained_again(tmp_path):
    """A committed record made before its run's post step ran (or before the step was added) does not make the run
    recorded: on a machine without the run directory the run is trained again, the step measures its weights, and
    the record comes back whole (the same numbers). A diverged run's record, whose post step had no weights to
    measure, stays recorded."""
    import shutil

    path = write_study(tmp_path, STUDY.replace("seeds: [0, 1]", "seeds: [0]"))
    study = load_study(path, runs_dir=tmp_path / "runs")
    run_local(study, pending(study), workers=1)
    write_page(study)
    before = json.loads((path.parent / "runs.json").read_text())
    assert before["lr0.05/seed0"]["post"] == ["max_logit.json"] and "max_logit" in before["lr0.05/seed0"]["last"]
    assert before["lr1e+30/seed0"] == {"diverged": {"epoch": 1}}  # no saved epoch: its post step had nothing
    shutil.rmtree(tmp_path / "runs")
    study = load_study(path, runs_dir=tmp_path / "runs")
    assert pending(study) == [] and set(status(study).values()) == {"recorded"}
    lacking = json.loads(json.dumps(before))
    del lacking["lr0.05/seed0"]["post"], lacking["lr0.05/seed0"]["last"]["max_logit"]
    (path.parent / "runs.json").write_text(json.dumps(lacking))
    assert status(study) == {"lr0.05/seed0": "new", "lr1e+30/seed0": "recorded"}
    assert [o.status for o in run_local(study, pending(study), workers=1)] == ["finished"]
    assert (study.runs["lr0.05/seed0"].run_dir / "max_logit.json").is_file()
    write_page(study)
    again, first = (json.loads((path.parent / "runs.json").read_text())["lr0.05/seed0"], before["lr0.05/seed0"])
    assert again["source"]["weights_sha256"] == first["source"]["weights_sha256"]  # metrics.jsonl also has timings
    assert {k: v for k, v in again.items() if k != "source"} == {k: v for k, v in first.items() if k != "source"}


@pytest.mark.parametrize("change, message", [
    (("metric: {metric: test_acc, at: last}", "metric: {metric: test_acc, at: best}"), "selects no epoch"),
    (("cells: [", "choose: {among: '*', by: test_acc}\n      cells: ["), "validation metrics only"),
    (("cells: [", "choose: {among: '*', by: val_acc, highest: true}\n      cells: ["), "a section's choose is"),
    (("digits: 4", "digits: 12"), "'digits' is an integer"),
])
def test_a_summary_without_selection_refuses_best_epochs_and_test_choices(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):  # when the study file is read, before any run or page
        summarise(load_study(write_study(tmp_path, LAST_ONLY.replace(*change)), runs_dir=tmp_path / "runs"), {})


def test_a_post_step_key_that_is_also_a_metric_is_refused(ran, tmp_path):
    study, _ = ran
    run = study.runs["lr0.05/seed0"]
    (run.run_dir / "max_logit.json").write_text(json.dumps({"max_logit": 1.0, "test_acc": 1.0}))
    spec = check_summary(dict(study.summary, columns=[{"metric": "test_acc"}, {"metric": "max_logit", "at": "last"}]))
    try:
        with pytest.raises(ConfigError, match="test_acc is also a metrics.jsonl key"):
            run_record(run.run_dir, spec, ("max_logit.json",))
    finally:
        (run.run_dir / "max_logit.json").unlink()


UFM_STUDY = """
name: ufm
seeds: [0, 1]
groups:
  - group: ufm
    run: "{reg}/seed{seed}"
    step: ufm
    grid: {reg: [sphere, weight_decay]}
    params: {num_classes: 4, dim: 2, regularization: "{reg}", temperature: 0.5, optimizer: gd, steps: 20,
             log_every: 20}
summary:
  select: null
  metric: {metric: gnc2, digits: 5}
  unit: GNC2
  sections: [{title: ufm, cells: [{label: "{reg}", group: ufm}], compare: [[sphere, weight_decay]]}]
"""


def test_a_run_step_computes_once_and_its_result_is_the_record(tmp_path):
    from kdcollapse.experiments.ufm import train_ufm

    path = write_study(tmp_path, UFM_STUDY)
    study = load_study(path, runs_dir=tmp_path / "runs")
    assert study.runs["weight_decay/seed1"].params["regularization"] == "weight_decay"
    outcomes = run_local(study, pending(study), workers=1)
    assert [o.status for o in outcomes] == ["finished"] * 4 and pending(study) == []
    assert set(status(study).values()) == {"finished"}
    direct = train_ufm(4, 2, regularization="weight_decay", temperature=0.5, optimizer="gd", steps=20, log_every=20,
                       seed=1)
    records = collect(study)
    assert records["weight_decay/seed1"] == {"last": {"gnc2": float(direct.final["gnc2"])}}
    text, summary = summarise(study, records)
    assert "| seeds | per seed (GNC2) | mean (GNC2) |" in text and summary["comparisons"][0]["seeds"] == [0, 1]


def test_a_committed_record_is_done_on_a_machine_without_the_run_directory(tmp_path):
    """A study resumed on a fresh machine (its run directories gone, its records committed) runs only what has no
    record: the records count as finished, and deleting one makes that run run again."""
    import json
    import shutil

    path = write_study(tmp_path, UFM_STUDY)
    study = load_study(path, runs_dir=tmp_path / "runs")
    run_local(study, pending(study), workers=1)
    write_page(study)
    before = json.loads((path.parent / "runs.json").read_text())
    shutil.rmtree(tmp_path / "runs")
    study = load_study(path, runs_dir=tmp_path / "runs")
    assert pending(study) == [] and set(status(study).values()) == {"recorded"}
    records = dict(before)
    del records["sphere/seed0"]
    (path.parent / "runs.json").write_text(json.dumps(records))
    assert [r.name for r in pending(study)] == ["sphere/seed0"]
    assert status(study)["sphere/seed0"] == "new" and status(study)["sphere/seed1"] == "recorded"
    assert [o.status for o in run_local(study, pending(study), workers=1)] == ["finished"]
    write_page(study)
    assert json.loads((path.parent / "runs.json").read_text()) == before  # the same record, computed again


@pytest.mark.parametrize("change, message", [
    (("step: ufm", "step: nothing"), "nothing"),
    (("step: ufm", "step: ufm\n    config: x.yaml"), "one of 'config'"),
    (("step: ufm", "step: ufm\n    overrides: [seed=1]"), "takes 'params', not 'overrides'"),
])
def test_bad_run_steps_are_refused(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        load_study(write_study(tmp_path, UFM_STUDY.replace(*change)))


def test_first_epoch_and_falls_read_the_whole_trajectory(tmp_path):
    series = [0.5, 0.4, 0.45, 0.3, 0.3, 0.2]  # fell at 3 of the 5 steps (an equal value is not a fall)
    (tmp_path / "metrics.jsonl").write_text("".join(
        json.dumps({"epoch": e + 1, "vci": v, "test_acc": 50.0 + e}) + "\n" for e, v in enumerate(series)))
    spec = check_summary({"select": None, "metric": {"metric": "test_acc"},
                          "columns": [{"metric": "vci", "at": "first"}, {"metric": "vci"}, {"metric": "vci", "at": "falls"}]})
    record = run_record(tmp_path, spec)
    assert record["first"]["vci"] == 0.5 and record["last"]["vci"] == 0.2 and record["falls"] == {"vci": 3}


@pytest.mark.heavy  # ~30 s: a launch in a subprocess (pytest -m heavy tests/test_study_steps.py)
def test_killing_a_launch_ends_its_workers_and_the_run_resumes_later(tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    from kdcollapse.runs import run_state

    path = write_study(tmp_path, STUDY.replace("lr: [0.05, 1.0e+30]", "lr: [0.05]").replace("train.epochs=2",
                                                                                             "train.epochs=400"))
    study = load_study(path, runs_dir=tmp_path / "runs")
    run_dir = study.runs["lr0.05/seed0"].run_dir
    launch = subprocess.Popen([sys.executable, "-m", "kdcollapse", "study", "run", str(path), "--runs-dir",
                               str(tmp_path / "runs"), "--only", "lr0.05/seed0"], stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline = time.time() + 120
    while not ((run_dir / "metrics.jsonl").is_file() and (run_dir / "metrics.jsonl").read_text().count("\n") >= 3):
        assert time.time() < deadline and launch.poll() is None, "the launch did not start training"
        time.sleep(0.05)
    launch.send_signal(signal.SIGKILL)
    launch.wait()
    deadline = time.time() + 30
    while run_state(run_dir) == "running":  # the worker still holds the run directory
        assert time.time() < deadline, "the worker outlived its launch"
        time.sleep(0.2)
    assert state_of(study.runs["lr0.05/seed0"]) == "interrupted"


@pytest.mark.parametrize("better, word", [(None, "better"), ("lower", "worse")])
def test_a_summary_where_lower_is_better_turns_the_verdict(tmp_path, better, word):
    text = LAST_ONLY if better is None else LAST_ONLY.replace("summary:\n", f"summary:\n  better: {better}\n", 1)
    study = load_study(write_study(tmp_path, text), runs_dir=tmp_path / "runs")
    records = {f"lr0.05/seed{s}": {"last": {"test_acc": 80.0 + s, "max_logit": 1.0}} for s in (0, 1)}
    records |= {f"lr1e+30/seed{s}": {"last": {"test_acc": 70.0 + 2 * s, "max_logit": 1.0}} for s in (0, 1)}
    text, summary = summarise(study, records)
    assert summary["comparisons"][0]["mean"] == 9.5 and summary["comparisons"][0]["verdict"] == word
    assert ("(a lower value is better)" in text) == (better == "lower")


def test_a_summary_refuses_an_unknown_direction(tmp_path):
    with pytest.raises(ConfigError, match="summary 'better'"):  # when the study file is read
        load_study(write_study(tmp_path, LAST_ONLY.replace("summary:\n", "summary:\n  better: smaller\n", 1)),
                   runs_dir=tmp_path / "runs")
