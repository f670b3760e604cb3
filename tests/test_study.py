"""Study files: expansion into runs (grid × seeds, teachers), the one done-rule, the local executor, the
lock between launches, the SLURM executor against a real cluster (bit for bit the local one), the summary's
statistics and verdicts, validation-only selection, and the ported results pages (their generated tables are
up to date and their tests match scipy)."""

from __future__ import annotations

import json
import math
import shutil
import statistics
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import yaml
from scipy import stats

from conftest import TINY_RUN
from kdcollapse.errors import ConfigError
from kdcollapse.report import holm, mean_difference_ci, verdict
from kdcollapse.runs import load_tensors, run_state
from kdcollapse.runs._lock import RunLock
from kdcollapse.study import (collect, execute, load_study, pending, run_local, state_of, submit_slurm, summarise,
                              write_page)

ROOT = Path(__file__).resolve().parents[1]
PORTED = sorted(p for p in ROOT.glob("results/**/study.yaml") if yaml.safe_load(p.read_text()).get("summary"))

TINY = "[" + ", ".join(json.dumps(o) for o in TINY_RUN) + "]"
STUDY = """
name: tiny
seeds: [0, 1]
define:
  common: &common TINY
groups:
  - group: teacher
    run: teacher
    config: CONFIGS/teacher.yaml
    seeds: [0]
    overrides: [*common, train.epochs=2]
  - group: kd
    run: kd/t{temperature}/seed{seed}
    config: CONFIGS/kd.yaml
    grid: {temperature: [2, 4]}
    teacher: teacher
    overrides: [*common, data.val_per_class=5, train.epochs=2, "method.temperature={temperature}"]
summary:
  metric: {metric: test_acc, at: best}
  noise_floor: 0.5
  sections:
    - title: tiny
      cells: [{label: "T = {temperature}", group: kd}]
      choose: {among: "T = *", by: val_acc}
      compare: [["T = 2", "T = 4"]]
"""


def tiny_study(tmp_path: Path, text: str = STUDY) -> Path:
    path = tmp_path / "study" / "study.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / "teacher.yaml").write_text("method: {name: vanilla}\n")
    (tmp_path / "kd.yaml").write_text("method: {name: kd, temperature: 4.0}\n")
    path.write_text(text.replace("TINY", TINY).replace("CONFIGS", str(tmp_path)))
    return path


def test_a_study_expands_to_its_grid_times_seeds_with_the_teacher_first(tmp_path):
    study = load_study(tiny_study(tmp_path), runs_dir=tmp_path / "runs")
    assert list(study.runs) == ["teacher", "kd/t2/seed0", "kd/t4/seed0", "kd/t2/seed1", "kd/t4/seed1"]
    kd = study.runs["kd/t4/seed1"]
    assert kd.values == {"seed": 1, "temperature": 4} and kd.teacher == "teacher"
    assert kd.overrides[-3:] == ("seed=1", f"run_dir={tmp_path / 'runs/kd/t4/seed1'}",
                                 f"teacher.checkpoint={tmp_path / 'runs/teacher'}")
    assert "method.temperature=4" in kd.overrides


@pytest.mark.parametrize("change, message", [
    (("teacher: teacher", "teacher: nobody"), "names teacher 'nobody'"),
    (("run: kd/t{temperature}/seed{seed}", "run: kd/seed{seed}"), "named twice"),
    (("run: kd/t{temperature}/seed{seed}", "run: kd/{tau}/seed{seed}"), "uses tau"),
    (("grid: {", "grids: {"), "grids"),
    (("by: val_acc", "by: test_acc"), "validation metrics only"),
    (("metric: {metric: test_acc, at: best}", "select: test_acc\n  metric: {metric: test_acc, at: best}"),
     "validation metrics only"),
])
def test_bad_study_files_are_refused_with_the_key_named(tmp_path, change, message):
    with pytest.raises(ConfigError, match=message):
        summarise(load_study(tiny_study(tmp_path, STUDY.replace(*change)), runs_dir=tmp_path / "runs"), {})


def test_holm_ci_and_verdict_follow_their_definitions():
    ps = [0.01, 0.04, 0.03, 0.2]
    # sorted 0.01, 0.03, 0.04, 0.2 times 4, 3, 2, 1, then running maxima
    assert holm(ps) == pytest.approx([0.04, 0.09, 0.09, 0.2])
    a, b = [80.0, 82.0, 79.0, 81.5], [78.0, 81.0, 76.0, 81.0]
    d = [x - y for x, y in zip(a, b)]
    expected = stats.t.interval(0.95, len(d) - 1, loc=statistics.mean(d), scale=stats.sem(d))
    assert mean_difference_ci(a, b) == pytest.approx(expected)
    assert verdict(1.0, 0.049, noise_floor=0.5) == "better" and verdict(-1.0, 0.01) == "worse"
    assert verdict(1.0, 0.051) == "no difference shown" and verdict(0.4, 0.001, noise_floor=0.5) == "no difference shown"
    assert verdict(1.0, math.nan) == "not tested"


def record(val, test):
    return {"best": {"val_acc": val, "test_acc": test}, "last": {"test_acc": test}}


def test_the_choice_reads_validation_and_the_verdicts_are_holm_corrected(tmp_path):
    study = load_study(tiny_study(tmp_path), runs_dir=tmp_path / "runs")
    # T = 4 is better on validation, T = 2 on test: the choice must be T = 4
    records = {"kd/t2/seed0": record(50, 90), "kd/t2/seed1": record(51, 91),
               "kd/t4/seed0": record(60, 80), "kd/t4/seed1": record(61, 82)}
    text, summary = summarise(study, records)
    assert "): T = 4" in text and "| T = 4 (chosen on val) | 0,1 |" in text
    (c,) = summary["comparisons"]
    assert c["per_seed"] == [10, 9] and c["p"] == pytest.approx(stats.ttest_rel([90, 91], [80, 82]).pvalue)
    assert c["holm_p"] == c["p"] and c["verdict"] == verdict(9.5, c["p"], noise_floor=0.5)


ONE_SEED = STUDY.replace("seeds: [0, 1]", "seeds: [0]")


@pytest.fixture(scope="module")
def local_study(tmp_path_factory):
    """The one-seed tiny study (a teacher, two students) run by the local executor."""
    tmp = tmp_path_factory.mktemp("study")
    study = load_study(tiny_study(tmp, ONE_SEED), runs_dir=tmp / "local")
    outcomes = run_local(study, pending(study), workers=2)
    return study, outcomes


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in ("images_per_s", "epoch_time_s")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_local_executor_trains_teacher_then_students_and_a_rerun_skips_them(local_study, tmp_path):
    study, outcomes = local_study
    assert [o.status for o in outcomes] == ["finished"] * 3 and outcomes[0].name == "teacher"
    assert all(run_state(r.run_dir) == "finished" for r in study.runs.values())
    assert pending(study) == [] and run_local(study, pending(study)) == []
    assert set(collect(study)) == set(study.runs) - {"teacher"}  # the summary's groups only
    # the same run trained again in this process is bit for bit the executor's
    spec, again = study.runs["kd/t2/seed0"], tmp_path / "again"
    assert execute(replace(spec, run_dir=again, overrides=(*spec.overrides, f"run_dir={again}"))).status == "finished"
    assert metrics(again) == metrics(spec.run_dir) and len(metrics(again)) == 2


def test_a_record_keeps_per_epoch_series_only_for_the_metrics_a_curves_plot_names(local_study):
    from kdcollapse.study import check_summary, run_record

    study, _ = local_study
    run_dir = study.runs["kd/t2/seed0"].run_dir
    spec = check_summary(study.summary)
    assert "epochs" not in run_record(run_dir, spec)  # opt-in: the committed records do not grow
    plot = {"file": "c.png", "kind": "curves", "section": "tiny", "metrics": ["test_acc", "train_loss"]}
    record = run_record(run_dir, {**spec, "plots": [plot]})
    rows = metrics(run_dir)
    assert record["epochs"] == {k: [[r["epoch"], r[k]] for r in rows] for k in ("test_acc", "train_loss")}
    assert [e for e, _ in record["epochs"]["test_acc"]] == [1, 2]


def test_an_interrupted_run_is_resumed_to_the_run_that_never_stopped(local_study, tmp_path):
    """A run stopped after its first epoch (here: trained with train.epochs=1) is "interrupted" for the
    study, which asks for 2, and resuming it gives the uninterrupted run's records exactly."""
    study, _ = local_study
    spec, again = study.runs["kd/t4/seed0"], tmp_path / "again"
    spec = replace(spec, run_dir=again, overrides=(*spec.overrides, f"run_dir={again}"))
    execute(replace(spec, overrides=(*spec.overrides, "train.epochs=1")))
    assert run_state(again) == "finished" and state_of(spec) == "interrupted"
    assert execute(spec).status == "finished" and state_of(spec) == "finished"
    assert metrics(again) == metrics(study.runs["kd/t4/seed0"].run_dir)


def test_a_run_held_by_another_launch_is_left_to_it(tmp_path):
    study = load_study(tiny_study(tmp_path), runs_dir=tmp_path / "runs")
    teacher = study.runs["teacher"]
    teacher.run_dir.mkdir(parents=True)
    lock = RunLock(teacher.run_dir)
    try:
        assert run_state(teacher.run_dir) == "running"
        assert execute(teacher).status == "running elsewhere"
        assert execute(study.runs["kd/t2/seed0"]).status == "blocked"  # its teacher is not finished
    finally:
        lock.release()
    assert run_state(teacher.run_dir) == "new"


@pytest.mark.parametrize("path", PORTED, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_ported_pages_are_what_study_report_writes(path):
    study = load_study(path, runs_dir=path.parent / "no-runs-here")  # the committed records only
    assert write_page(study, check=True) == [], f"run `kdcollapse study report {path.relative_to(ROOT)}`"


@pytest.mark.parametrize("path", PORTED, ids=lambda p: str(p.parent.relative_to(ROOT)))
def test_ported_pages_tests_match_scipy_on_their_records(path):
    study = load_study(path, runs_dir=path.parent / "no-runs-here")
    _, summary = summarise(study, collect(study))
    assert summary["comparisons"]
    tested = [c for c in summary["comparisons"] if len(c["seeds"]) > 1]
    for c in tested:
        assert c["mean"] == pytest.approx(statistics.mean(c["per_seed"]))
        sd = statistics.stdev(c["per_seed"])
        if sd > 0:
            t = c["mean"] / (sd / math.sqrt(len(c["seeds"])))
            assert c["p"] == pytest.approx(2 * stats.t.sf(abs(t), len(c["seeds"]) - 1))
    smallest = min(tested, key=lambda c: c["p"])
    assert smallest["holm_p"] == pytest.approx(min(1.0, len(tested) * smallest["p"]))
    assert all(c["holm_p"] >= c["p"] for c in tested)


def slurm_unreachable() -> str | None:
    if shutil.which("sbatch") is None:
        return "no SLURM: sbatch not on PATH (bash .ci/slurm.sh starts a one-node cluster as root)"
    try:
        nodes = subprocess.run(["sinfo", "-h", "-o", "%T"], capture_output=True, text=True, timeout=20).stdout
    except (OSError, subprocess.TimeoutExpired) as err:
        return f"no SLURM: sinfo failed ({err})"
    if not any(state.strip().rstrip("*") in ("idle", "mixed", "allocated") for state in nodes.split()):
        return f"no SLURM: no node is up (sinfo: {nodes.strip() or 'nothing'}); bash .ci/slurm.sh starts one"
    return None


@pytest.mark.slow
def test_a_study_through_slurm_equals_the_local_executor_bit_for_bit(local_study, tmp_path):
    """`.ci/run` starts a one-node cluster (`.ci/slurm.sh`); without one reachable this skips and says why."""
    why = slurm_unreachable()
    if why:
        pytest.skip(why)
    pytest.importorskip("submitit", reason="the SLURM executor needs submitit (pip install 'kdcollapse[slurm]')")
    local = local_study[0]
    slurm = load_study(local.path, runs_dir=tmp_path / "slurm")
    jobs = submit_slurm(slurm, pending(slurm), tmp_path / "submitit", threads=1)
    assert len({j.job_id.split("_")[0] for j in jobs}) == 2  # the teacher's array, then the students' array
    outcomes = [job.result() for job in jobs]
    assert {o.status for o in outcomes} == {"finished"}, [o.message for o in outcomes]
    assert pending(slurm) == []
    for name, run in local.runs.items():
        other = slurm.runs[name].run_dir
        assert metrics(run.run_dir) == metrics(other), name
        a, _ = load_tensors(run.run_dir / "model.safetensors")
        b, _ = load_tensors(other / "model.safetensors")
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), name


def test_the_cli_reports_status_and_checks_pages(tmp_path, capsys):
    from kdcollapse.cli import main

    path = tiny_study(tmp_path)
    assert main(["study", "status", str(path), "--runs-dir", str(tmp_path / "runs")]) == 0
    assert "new          kd/t4/seed1" in capsys.readouterr().out
    assert main(["study", "report", "--check", *map(str, PORTED)]) == 0
    assert main(["study", "status", str(tmp_path / "missing.yaml")]) == 2
    assert "error: no study file" in capsys.readouterr().err


def test_dkd_beta_runs_have_the_configs_of_the_committed_protocol(tmp_path):
    """The runs of results/distillation/dkd_beta were trained by the job lists this study file replaced
    (protocol.sh, teachers.sh, dkd_beta/jobs.sh at 181eb2f, whose channels_last default was false); the
    study's configs must be those, key for key (with that code they reproduce the runs bit for bit)."""
    from kdcollapse.config import config_to_dict, load_config
    from kdcollapse.recipes import config_file

    study = load_study(ROOT / "results/distillation/dkd_beta/study.yaml", runs_dir=tmp_path)
    old = {  # the old command lines, transcribed
        "teacher_k100": ("configs/fashion_mnist_pairs/teacher.yaml", "model.name=convnet_small seed=0 "
                         "data.train_per_class=50 data.val_per_class=5 data.test_per_class=10 data.batch_size=64 "
                         "train.epochs=5 train.progress=false"),
        "dkd_beta/k10/beta4/seed2": ("configs/fashion_mnist/dkd.yaml", f"teacher.checkpoint={tmp_path}/teacher_k10 "
                                     "seed=2 data.train_per_class=200 data.val_per_class=30 data.test_per_class=100 "
                                     "data.batch_size=64 train.epochs=6 method.beta=4"),
        "dkd_beta/k100/student/seed1": ("configs/fashion_mnist_pairs/student.yaml", "seed=1 data.train_per_class=20 "
                                        "data.val_per_class=5 data.test_per_class=10 data.batch_size=64 train.epochs=6"),
    }
    for name, (config, overrides) in old.items():
        run = study.runs[name]
        expected = load_config(ROOT / config, [*overrides.split(), f"run_dir={tmp_path / name}",
                                               "train.channels_last=false", "train.progress=false"])
        got = load_config(config_file(run.config), list(run.overrides))
        assert config_to_dict(got) == config_to_dict(expected), name
