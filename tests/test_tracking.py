"""W&B and MLflow trackers in their offline / local modes: a tiny run logs every epoch record under its group
(a study's name), and the numbers are those of metrics.jsonl; a resume after a crash between an epoch's commit
and its log gives each tracker that epoch, once. Both packages are in the dev extra (`make test`, CI); the tests
skip where they are not installed."""

from __future__ import annotations

import json

import pytest

from kdcollapse.train import fit


def records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_mlflow_tracker_logs_each_epoch_under_the_group(tmp_path, tiny_config, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())  # a local store, no server
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    run_dir = fit(tiny_config(tmp_path / "run", "train.epochs=2", "train.trackers=[mlflow]",
                              "train.group=my_study")).run_dir
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("my_study").experiment_id])
    assert run.data.tags["kdcollapse.group"] == "my_study" and run.data.params["train.group"] == "my_study"
    history = client.get_metric_history(run.info.run_id, "test_acc")
    assert [(m.step, m.value) for m in history] == [(r["epoch"], r["test_acc"]) for r in records(run_dir)]


class _Crash(Exception):
    pass


def test_mlflow_gets_on_resume_the_committed_epoch_a_crash_kept_from_it(tmp_path, tiny_config, monkeypatch):
    mlflow = pytest.importorskip("mlflow")
    from kdcollapse.config import load_config
    from kdcollapse.runs._tracking import MlflowTracker

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    log = MlflowTracker.log

    def crash_at_epoch_2(self, record):  # epoch 2 is committed, then the process dies before MLflow hears of it
        if record["epoch"] == 2:
            raise _Crash
        log(self, record)

    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(MlflowTracker, "log", crash_at_epoch_2)
        with pytest.raises(_Crash):
            fit(tiny_config(run_dir, "train.epochs=3", "train.trackers=[mlflow]"))
    assert [r["epoch"] for r in records(run_dir)] == [1, 2]  # committed
    client = mlflow.MlflowClient()
    (crashed,) = client.search_runs([client.get_experiment_by_name("kdcollapse").experiment_id])
    assert crashed.info.status == "FAILED"  # the error ended the tracked run as failed
    fit(load_config(run_dir / "config.yaml", [f"run_dir={run_dir}"]), resume=True)
    (run,) = client.search_runs([client.get_experiment_by_name("kdcollapse").experiment_id])
    assert run.info.status == "FINISHED"
    for key in ("test_acc", "train_loss"):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted((m.step, m.value) for m in history) == [(r["epoch"], r[key]) for r in records(run_dir)]


WANDB_ENV = {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_DISABLE_GIT": "true", "WANDB_CONSOLE": "off",
             "WANDB_DISABLE_CODE": "true"}  # offline, and no probes the tests do not need


@pytest.fixture(scope="module")
def wandb_resumed_run(tmp_path_factory, tiny_config):
    """An offline W&B run of a study's group whose process died after committing epoch 2 and before logging
    it, then resumed to epoch 3: (run directory, its segments in start order, as ``wandb sync`` uploads them)."""
    pytest.importorskip("wandb")
    from kdcollapse.config import load_config
    from kdcollapse.runs._tracking import WandbTracker

    log = WandbTracker.log

    def crash_at_epoch_2(self, record):  # the row of epoch 2's last step (its epoch record merged in)
        if record.get("epoch") == 2:
            raise _Crash
        log(self, record)

    run_dir = tmp_path_factory.mktemp("wandb") / "run"
    with pytest.MonkeyPatch.context() as m:
        for key, value in WANDB_ENV.items():
            m.setenv(key, value)
        with m.context() as crash:
            crash.setattr(WandbTracker, "log", crash_at_epoch_2)
            with pytest.raises(_Crash):
                fit(tiny_config(run_dir, "train.epochs=3", "train.trackers=[wandb]", "train.group=my_study"))
        assert [r["epoch"] for r in records(run_dir)] == [1, 2]  # committed
        fit(load_config(run_dir / "config.yaml", [f"run_dir={run_dir}"]), resume=True)
    return run_dir, sorted((run_dir / "wandb").glob("offline-run-*"))


@pytest.mark.slow
def test_wandb_tracker_writes_an_offline_run_in_the_group(wandb_resumed_run):
    from kdcollapse.runs._tracking import wandb_records

    run_dir, segments = wandb_resumed_run
    for segment in segments:
        (path,) = segment.glob("run-*.wandb")
        (run,) = [r.run for r in wandb_records(path) if r.WhichOneof("record_type") == "run"]
        assert run.run_group == "my_study" and list(run.tags) == ["my_study"] and run.display_name == "run"


@pytest.mark.slow
def test_wandb_gets_on_resume_the_committed_epoch_a_crash_kept_from_it(wandb_resumed_run):
    """The crashed segment holds epoch 1, the resumed segment (same run id) epochs 2 and 3, so the segments in
    the order ``wandb sync`` uploads them hold every epoch once, with metrics.jsonl's values. W&B's x is the
    optimizer step (4 per epoch here; per-step rows every train.log_every=10 steps and at each epoch's end): an
    epoch's record is in the row of its last step, with its epoch as a value."""
    from kdcollapse.runs._tracking import wandb_history, wandb_records

    run_dir, segments = wandb_resumed_run
    assert len(segments) == 2 and len({s.name.rsplit("-", 1)[1] for s in segments}) == 1  # one run id
    logged = [[step for step, _ in wandb_history(next(s.glob("run-*.wandb")))] for s in segments]
    assert logged == [[4], [8, 10, 12]]
    exits = [[r.exit.exit_code for r in wandb_records(next(s.glob("run-*.wandb"))) if r.WhichOneof("record_type")
              == "exit"] for s in segments]
    assert exits == [[1], [0]]  # the crash ended its segment as failed
    history = [h for s in segments for h in wandb_history(next(s.glob("run-*.wandb")))]
    epochs = [(step, items) for step, items in history if "test_acc" in items]
    for (step, items), record in zip(epochs, records(run_dir), strict=True):
        assert step == 4 * record["epoch"] and items["epoch"] == record["epoch"]
        for key in ("test_acc", "train_loss", "lr"):
            assert items[key] == pytest.approx(record[key], rel=1e-12), key


@pytest.mark.slow
def test_wandb_history_stops_at_a_torn_last_record(wandb_resumed_run, tmp_path):
    """A kill can tear the log's last record: the reader keeps the whole records before it, and refuses a file
    of another format (the replay then logs nothing rather than an epoch twice)."""
    import shutil

    from kdcollapse.runs._tracking import wandb_history

    path = tmp_path / "run.wandb"
    shutil.copy(next(wandb_resumed_run[1][1].glob("run-*.wandb")), path)  # resumed segment: steps 8, 10, 12
    whole, data, seen = wandb_history(path), path.read_bytes(), set()
    assert [s for s, _ in whole] == [8, 10, 12]
    for end in range(7, len(data), 17):  # the log cut every 17 bytes: a prefix of the whole history
        path.write_bytes(data[:end])
        history = wandb_history(path)
        assert history == whole[:len(history)]
        seen.add(len(history))
    assert seen == {0, 1, 2, 3}
    path.write_bytes(b"not a W&B log")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        wandb_history(path)


def test_wandb_disabled_trains_and_resumes_without_waiting_for_a_log(tmp_path, tiny_config, monkeypatch, recwarn):
    """WANDB_MODE=disabled writes no transaction log: closing does not wait for one, a resume replays nothing."""
    pytest.importorskip("wandb")
    from kdcollapse.config import load_config

    monkeypatch.setenv("WANDB_MODE", "disabled")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = fit(tiny_config(tmp_path / "run", "train.epochs=1", "train.trackers=[wandb]")).run_dir
    fit(load_config(run_dir / "config.yaml", [f"run_dir={run_dir}", "train.epochs=2"]), resume=True)
    assert [r["epoch"] for r in records(run_dir)] == [1, 2]
    assert not [w for w in recwarn if "W&B" in str(w.message)]


def _image_run(tmp_path, tiny_config, *extra):
    return fit(tiny_config(tmp_path / "run", "train.epochs=2", "train.log_every=3", *extra)).run_dir


def _lm_run(tmp_path, tiny_config, *extra):
    """A tiny distill-lm run (tests/tiny_lm.py): 5 steps, an evaluation every 2, per-step scalars every 2."""
    from kdcollapse.config_lm import load_lm_config
    from kdcollapse.train import distill_lm
    from tiny_lm import distill_lm_files

    _, files = distill_lm_files(tmp_path, teacher_hidden=32, copies=6)
    cfg = load_lm_config(None, [*files, "block_size=8", "train_blocks=20", "eval_blocks=2", "batch_size=2", "steps=5",
                                "eval_every=2", "warmup=1", "log_every=2", f"run_dir={tmp_path / 'run'}",
                                *(x.removeprefix("train.") for x in extra)])
    distill_lm(cfg, log=lambda *_: None)
    return tmp_path / "run"


@pytest.mark.slow
@pytest.mark.parametrize("task", ["image", "lm"])
def test_per_step_scalars_reach_tensorboard_mlflow_and_wandb_on_both_tasks(task, tmp_path, tiny_config,
                                                                          monkeypatch):
    """The per-step records committed in steps.jsonl (every log_every optimizer steps and at each epoch's or the
    run's end) reach TensorBoard, MLflow and W&B as ``step/<key>`` at their optimizer step, for an image run and
    a language-model run alike (one MetricsLog, one tracker_rows); the commit records keep their x (MLflow,
    TensorBoard: an image run's epoch, an LM run's step)."""
    mlflow = pytest.importorskip("mlflow")
    pytest.importorskip("wandb")
    pytest.importorskip("tensorboard")
    from test_faults_tensorboard import scalars

    from kdcollapse.runs._tracking import wandb_history

    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    for key, value in WANDB_ENV.items():
        monkeypatch.setenv(key, value)
    make = _image_run if task == "image" else _lm_run
    run_dir = make(tmp_path, tiny_config, "train.trackers=[mlflow, wandb]", "train.tensorboard=true")
    steps = [json.loads(line) for line in (run_dir / "steps.jsonl").read_text().splitlines()]
    expected = [(r["step"], r["train_loss"]) for r in steps]
    x = [s for s, _ in expected]
    assert x == ([3, 4, 6, 8] if task == "image" else [2, 4, 5])  # log_every, and each epoch's / the run's end
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("kdcollapse").experiment_id])
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "step/train_loss")] == expected
    commit_x = "epoch" if task == "image" else "step"
    assert [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "train_loss")] == [
        (r[commit_x], r["train_loss"]) for r in records(run_dir)]
    events = scalars(run_dir)
    assert [(s, v) for tag, s, v in events if tag == "step/train_loss"] == [
        (s, pytest.approx(v, rel=1e-6)) for s, v in expected]
    assert [s for tag, s, _ in events if tag == "train_loss"] == [r[commit_x] for r in records(run_dir)]
    (segment,) = (run_dir / "wandb").glob("offline-run-*")
    history = wandb_history(next(segment.glob("run-*.wandb")))
    assert [(s, items["step/train_loss"]) for s, items in history if "step/train_loss" in items] == [
        (s, pytest.approx(v, rel=1e-12)) for s, v in expected]
