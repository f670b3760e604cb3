"""TensorBoard's event log under crashes (issue 28, item 1): an append-only log cannot be replaced atomically, so
it is kept a prefix of what was committed. An epoch's scalars are logged only after its commit, and every start
rebuilds the log from the committed records, under the run's lock: a crash never leaves a step that
``state.json`` does not record, and a resumed run holds every step exactly once, with the values of
``metrics.jsonl``. Checked at every write point of an epoch and with a real ``kill -9``."""

from __future__ import annotations

import json
import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from test_faults import MLP, Crash, crash_at, crashed_copies, resume

from kdcollapse.config import load_config
from kdcollapse.runs import read_metrics
from kdcollapse.train import fit

pytest.importorskip("tensorboard")

TB = ["train.tensorboard=true", "train.device=cpu"]


def scalars(run_dir: Path) -> list[tuple[str, int, float]]:
    """Every scalar event in ``run_dir/tensorboard`` as written, duplicates included (read raw: TensorBoard's own
    accumulator would hide out-of-order and repeated steps)."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    found = []
    for path in sorted((Path(run_dir) / "tensorboard").glob("*tfevents*")):
        for event in EventFileLoader(str(path)).Load():
            for value in event.summary.value:
                number = value.tensor.float_val[0] if value.HasField("tensor") else value.simple_value
                found.append((value.tag, event.step, number))
    return found


def committed_epoch(run_dir: Path) -> int:
    state = Path(run_dir) / "state.json"
    return json.loads(state.read_text())["epoch"] if state.exists() else 0


def committed_steps(run_dir: Path) -> list[dict]:
    """The per-step records (steps.jsonl) of the committed epochs."""
    from kdcollapse.runs._run_dir import read_committed_metrics

    return read_committed_metrics(Path(run_dir), name="steps.jsonl") if (Path(run_dir) / "steps.jsonl").exists() else []


def assert_prefix_of_committed(run_dir: Path) -> None:
    """No epoch after the committed epoch and no per-step scalar (``step/<key>``, x the optimizer step) after
    its last committed step, none twice."""
    events = scalars(run_dir)
    last, last_step = committed_epoch(run_dir), max((r["step"] for r in committed_steps(run_dir)), default=0)
    assert all(step <= (last_step if tag.startswith("step/") else last) for tag, step, _ in events), (
        last, last_step, sorted({(t.startswith("step/"), s) for t, s, _ in events}))
    assert max(Counter((tag, step) for tag, step, _ in events).values(), default=1) == 1


def assert_matches_metrics(run_dir: Path, epochs: int) -> None:
    """Every step 1..epochs exactly once, with the values of metrics.jsonl (as float32), and every per-step
    record of steps.jsonl once as ``step/<key>`` at its optimizer step."""
    events = scalars(run_dir)
    assert Counter((tag, step) for tag, step, _ in events).most_common(1)[0][1] == 1
    assert sorted({step for tag, step, _ in events if tag == "test_acc"}) == list(range(1, epochs + 1))
    logged = {(tag, step): value for tag, step, value in events}
    steps = committed_steps(run_dir)
    assert steps and {r["epoch"] for r in steps} == set(range(1, epochs + 1))
    assert sorted(step for tag, step, _ in events if tag == "step/train_loss") == [r["step"] for r in steps]
    for record in steps:
        assert logged[("step/train_loss", record["step"])] == pytest.approx(record["train_loss"], rel=1e-6)
    for record in read_metrics(run_dir):
        for key, value in record.items():
            if key != "epoch" and isinstance(value, (int, float)):
                assert logged[(key, record["epoch"])] == pytest.approx(float(value), rel=1e-6, abs=1e-30), key


def tb_run(run_dir, epochs):
    return fit(load_config(None, [*MLP, *TB, f"run_dir={run_dir}", f"train.epochs={epochs}"]))


def test_a_crash_at_any_write_point_leaves_only_committed_steps_and_resume_logs_each_once(tmp_path, monkeypatch):
    one = tb_run(tmp_path / "one", 1).run_dir
    assert_matches_metrics(one, 1)
    for snapshot in crashed_copies(one, tmp_path, monkeypatch):  # epoch 2 crashed at each write point
        assert_prefix_of_committed(snapshot)  # what kill -9 at this instant leaves
        resume(snapshot, 3)
        assert_matches_metrics(snapshot, 3)


def test_turning_tensorboard_on_in_a_resume_logs_the_earlier_epochs(tmp_path):
    run_dir = fit(load_config(None, [*MLP, "train.device=cpu", f"run_dir={tmp_path / 'run'}", "train.epochs=1"])).run_dir
    assert not (run_dir / "tensorboard").exists()
    fit(load_config(run_dir / "config.yaml", [f"run_dir={run_dir}", "train.epochs=2", "train.tensorboard=true"]),
        resume=True)
    assert_matches_metrics(run_dir, 2)


@pytest.mark.slow
def test_kill_9_mid_training_leaves_no_phantom_step_and_resume_no_duplicate(tmp_path):
    """The killed process is a fork of the test process (tests/ranks.py: no interpreter start-up)."""
    from ranks import Forked

    run_dir = tmp_path / "run"
    (tmp_path / "empty.yaml").write_text("{}\n")
    proc = Forked(["train", "--config", str(tmp_path / "empty.yaml"), *MLP, *TB, "train.epochs=100000",
                   f"run_dir={run_dir}"], tmp_path / "train.err")
    try:
        deadline = time.time() + 180
        while committed_epoch(run_dir) < 2:
            assert proc.poll() is None and time.time() < deadline, proc.stderr()[-2000:]
            time.sleep(0.01)
        time.sleep(random.uniform(0.0, 0.5))  # an arbitrary instant of a later epoch
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr()[-2000:]  # killed, not ended on its own
    assert_prefix_of_committed(run_dir)
    reached = committed_epoch(run_dir)
    resume(run_dir, reached + 1)
    assert_matches_metrics(run_dir, reached + 1)


def test_trackers_see_only_committed_epochs(tmp_path, monkeypatch):
    """W&B and MLflow get an epoch's record and its per-step scalars after its commit, like TensorBoard: a crash
    during the commit logs nothing of that epoch (its resume logs it once)."""
    import shutil

    import kdcollapse.runs._metrics_log as run_dir_module

    logged, rows = [], []

    class Fake:
        def log(self, record):  # a row: per-step scalars, with the epoch's record in its last step's row
            rows.append(record["step"])
            if "epoch" in record:
                logged.append(record["epoch"])

        def replay(self, records):  # holds every epoch it was given (MLflow's replay: tests/test_tracking.py)
            pass

        def close(self, failed=False):
            pass

    monkeypatch.setattr(run_dir_module, "open_trackers", lambda *args: [Fake()])
    one = fit(load_config(None, [*MLP, "train.device=cpu", f"run_dir={tmp_path / 'one'}", "train.epochs=1"])).run_dir
    assert logged == [1]
    for point in (0, 3):  # two write points of epoch 2 before its commit (state.json)
        logged.clear()
        rows.clear()
        run_dir, snapshot = tmp_path / f"run{point}", tmp_path / f"crashed{point}"
        shutil.copytree(one, run_dir)
        with monkeypatch.context() as m, pytest.raises(Crash):
            crash_at(m, run_dir, point, snapshot)
            resume(run_dir, 2)
        assert logged == [] and rows == [] and committed_epoch(snapshot) == 1
        resume(snapshot, 2)
        assert logged == [2]
