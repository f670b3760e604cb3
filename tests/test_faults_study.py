"""`kdcollapse study run` killed (SIGKILL) at random instants resumes exactly: the local executor (its launcher
alone, or its whole process group: launcher, forkserver, workers) and the SLURM executor's launcher on the
one-node cluster of `.ci/slurm.sh` (skipped, saying why, without one); and a second launch of a study that is
running is refused with one line and changes nothing. The kill instants are drawn from a seeded generator, the
outcome does not depend on them: every run, its records and the page equal those of a launch never killed."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_faults import assert_same_run, files
from test_study import slurm_unreachable

from conftest import TINY_RUN
from kdcollapse.cli import main
from kdcollapse.runs import run_state
from kdcollapse.study import launch_lock

ROOT = Path(__file__).resolve().parents[1]
TINY = "[" + ", ".join(json.dumps(o) for o in TINY_RUN) + "]"
EPOCHS = {"teacher": 4, "kd/t2": 3, "kd/t4": 3}
STUDY = """
name: NAME
runs_dir: RUNS
seeds: [0]
define:
  tiny: &tiny TINY
groups:
  - {group: teacher, run: teacher, config: CONFIG, overrides: [*tiny, train.epochs=TEACHER_EPOCHS]}
  - {group: kd, run: "kd/t{t}", config: CONFIG, teacher: teacher, grid: {t: [2, 4]},
     overrides: [*tiny, train.epochs=3, method.name=kd, "method.temperature={t}"]}
summary:
  select: null
  metric: {metric: test_acc, at: last}
  sections: [{title: kd, cells: [{label: "T = {t}", group: kd}], compare: [["T = 2", "T = 4"]]}]
"""


def write_study(folder: Path, name: str, teacher_epochs: int = EPOCHS["teacher"]) -> Path:
    folder.mkdir(parents=True)
    (folder / "empty.yaml").write_text("{}\n")
    text = STUDY.replace("NAME", name).replace("TINY", TINY).replace("CONFIG", str(folder / "empty.yaml"))
    text = text.replace("RUNS", str(folder / "runs"))
    (folder / "study.yaml").write_text(text.replace("TEACHER_EPOCHS", str(teacher_epochs)))
    return folder / "study.yaml"


def launch(study: Path, *args: str) -> subprocess.Popen:
    """``kdcollapse study run STUDY ARGS`` in a process group of its own (its forkserver and workers join it)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "kdcollapse", "study", "run", str(study), *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, start_new_session=True)


def runs_let_go(runs_dir: Path, timeout: float = 60) -> None:
    """Wait until no process holds a run directory's lock (a killed launcher's workers end within ~1 s)."""
    deadline = time.time() + timeout
    while any(run_state(runs_dir / name) == "running" for name in EPOCHS):
        assert time.time() < deadline, "a run directory is still locked after the launcher was killed"
        time.sleep(0.2)


def assert_same_study(reference: Path, other: Path) -> None:
    """Every run tensor for tensor and metric for metric, the records but for their file digests (metrics.jsonl
    holds the epochs' times), the page's statistics and its text."""
    for name, epochs in EPOCHS.items():
        assert_same_run(reference.parent / "runs" / name, other.parent / "runs" / name, epochs)
    records = [{n: {k: v for k, v in r.items() if k != "source"} for n, r in json.loads(
        (study.parent / "runs.json").read_text()).items()} for study in (reference, other)]
    assert records[0] == records[1] and sorted(records[0]) == ["kd/t2", "kd/t4"]
    assert (reference.parent / "summary.json").read_text() == (other.parent / "summary.json").read_text()
    pages = [(study.parent / "README.md").read_text().split("\n", 1)[1] for study in (reference, other)]
    assert pages[0] == pages[1]  # but for its title, the study's name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The study run once, never killed; and how long that took (the range of the kill instants)."""
    study = write_study(tmp_path_factory.mktemp("reference") / "study", "faults")
    began = time.time()
    assert main(["study", "run", str(study), "--workers", "2"]) == 0
    return study, time.time() - began


@pytest.mark.slow
def test_kill_9_at_random_instants_during_a_local_study_run_then_it_resumes_exactly(reference, tmp_path):
    study = write_study(tmp_path / "study", "faults")
    rng, killed = random.Random(42), []
    for whole_group in (False, True, True):  # the launcher alone (its workers follow it), then everything at once
        proc = launch(study, "--workers", "2")
        time.sleep(rng.uniform(1.0, 1.0 + reference[1]))  # interpreter start-up included
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL) if whole_group else proc.send_signal(signal.SIGKILL)
            killed.append(whole_group)
        proc.wait()
        assert proc.returncode in (0, -signal.SIGKILL), proc.stderr.read().decode()[-2000:]
        runs_let_go(study.parent / "runs")
    assert killed, "every launch ended before its kill: the instants were drawn past the study's length"
    assert main(["study", "run", str(study), "--workers", "2"]) == 0  # the launch that finishes what was left
    assert_same_study(reference[0], study)


@pytest.mark.heavy  # minutes of SLURM scheduling on top of the runs: pytest -m heavy, after bash .ci/slurm.sh
def test_kill_9_of_a_slurm_study_launcher_then_it_resumes_exactly(reference, tmp_path):
    """The launcher of ``--executor slurm`` killed while it submits or waits: the jobs it submitted go on (each
    locks its run), and the next launch, once they ended, trains only what is left."""
    why = slurm_unreachable()
    if why:
        pytest.skip(why)
    pytest.importorskip("submitit", reason="the SLURM executor needs submitit (pip install 'kdcollapse[slurm]')")
    name = f"faults{os.getpid()}"
    study = write_study(tmp_path / "study", name)
    rng = random.Random(7)

    def queued() -> bool:
        jobs = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=60).stdout
        return any(line.startswith(f"{name}:") for line in jobs.split())

    proc = launch(study, "--executor", "slurm", "--threads", "1")
    time.sleep(rng.uniform(1.0, 1.0 + reference[1]))
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()
    deadline = time.time() + 600
    while queued():  # the killed launcher's jobs run to their end
        assert time.time() < deadline
        time.sleep(1.0)
    runs_let_go(study.parent / "runs")
    assert main(["study", "run", str(study), "--executor", "slurm", "--threads", "1"]) == 0
    # the local reference and these SLURM runs: bit for bit the same (the random state is a function of seed, epoch)
    assert_same_study(reference[0], study)


@pytest.mark.slow
def test_a_second_launch_of_a_running_study_is_refused_and_changes_nothing(tmp_path, capsys):
    """While one ``study run`` trains (frozen here with SIGSTOP, holding its locks), a second one of the same
    study exits 2 with one line and writes nothing; ``study status`` still reads it; once the first is killed,
    its lock is gone with it."""
    study = write_study(tmp_path / "study", "busy", teacher_epochs=100000)
    runs = study.parent / "runs"
    proc = launch(study)
    try:
        deadline = time.time() + 180
        while not (runs / "teacher" / "checkpoint.safetensors").exists():
            assert proc.poll() is None and time.time() < deadline, proc.stderr.read().decode()[-2000:]
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGSTOP)
        before = {p: files(p) for p in (study.parent, runs)}
        capsys.readouterr()
        assert main(["study", "run", str(study)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and "is being run by another process" in err, err
        assert main(["study", "status", str(study)]) == 0
        assert "running      teacher" in capsys.readouterr().out
        assert {p: files(p) for p in (study.parent, runs)} == before
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    runs_let_go(runs)
    with launch_lock(study):  # the launch lock died with the launcher
        pass
