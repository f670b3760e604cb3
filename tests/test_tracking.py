"""W&B and MLflow trackers in their offline / local modes: a tiny run logs every epoch record under its group
(a study's name), and the numbers are those of metrics.jsonl. Skipped when the package is not installed."""

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


@pytest.mark.slow
def test_wandb_tracker_writes_an_offline_run_in_the_group(tmp_path, tiny_config, monkeypatch):
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_dir = fit(tiny_config(tmp_path / "run", "train.epochs=2", "train.trackers=[wandb]",
                              "train.group=my_study")).run_dir
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    (data,) = offline.glob("run-*.wandb")  # the records W&B would sync: config, group, each epoch's metrics
    content = data.read_bytes()
    assert b"my_study" in content and b"test_acc" in content and b"train_loss" in content


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
    fit(load_config(run_dir / "config.yaml", [f"run_dir={run_dir}"]), resume=True)
    client = mlflow.MlflowClient()
    (run,) = client.search_runs([client.get_experiment_by_name("kdcollapse").experiment_id])
    for key in ("test_acc", "train_loss"):
        history = client.get_metric_history(run.info.run_id, key)
        assert sorted((m.step, m.value) for m in history) == [(r["epoch"], r[key]) for r in records(run_dir)]


def test_wandb_gets_on_resume_the_committed_epoch_a_crash_kept_from_it(tmp_path, tiny_config, monkeypatch):
    """Offline W&B: the crashed run's segment holds epoch 1, the resumed segment (same run id) epochs 2 and 3, so
    the segments in the order ``wandb sync`` uploads them hold every epoch once, with metrics.jsonl's values."""
    pytest.importorskip("wandb")
    from kdcollapse.config import load_config
    from kdcollapse.runs._tracking import WandbTracker, wandb_history

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    log = WandbTracker.log

    def crash_at_epoch_2(self, record):
        if record["epoch"] == 2:
            raise _Crash
        log(self, record)

    run_dir = tmp_path / "run"
    with monkeypatch.context() as m:
        m.setattr(WandbTracker, "log", crash_at_epoch_2)
        with pytest.raises(_Crash):
            fit(tiny_config(run_dir, "train.epochs=3", "train.trackers=[wandb]"))
    assert [r["epoch"] for r in records(run_dir)] == [1, 2]
    fit(load_config(run_dir / "config.yaml", [f"run_dir={run_dir}"]), resume=True)
    segments = sorted((run_dir / "wandb").glob("offline-run-*"))  # by start time, as wandb sync orders them
    assert len(segments) == 2 and len({s.name.rsplit("-", 1)[1] for s in segments}) == 1  # one run id
    logged = [history for s in segments for history in wandb_history(next(s.glob("run-*.wandb")))]
    assert [step for step, _ in logged] == [1, 2, 3]
    for (step, items), record in zip(logged, records(run_dir)):
        assert step == record["epoch"]
        assert items["test_acc"] == pytest.approx(record["test_acc"]) and items["train_loss"] == pytest.approx(
            record["train_loss"])


def test_wandb_history_stops_at_a_torn_last_record(tmp_path, monkeypatch):
    """A kill can tear the log's last record: the reader keeps the whole records before it, and refuses a file
    of another format (the replay then logs nothing rather than an epoch twice)."""
    pytest.importorskip("wandb")
    from kdcollapse.runs._tracking import WandbTracker, wandb_history

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    tracker = WandbTracker(tmp_path, {}, "")
    for epoch in (1, 2, 3):
        tracker.log({"epoch": epoch, "x": float(epoch)})
    tracker.close()  # returns once the log is written to its end
    (path,) = (tmp_path / "wandb").glob("offline-run-*/run-*.wandb")
    assert [(s, h["x"]) for s, h in wandb_history(path)] == [(1, 1.0), (2, 2.0), (3, 3.0)]
    whole, data, seen = wandb_history(path), path.read_bytes(), set()
    for end in range(7, len(data), 3):  # the log cut at every third byte: a prefix of the whole history
        path.write_bytes(data[:end])
        history = wandb_history(path)
        assert history == whole[:len(history)]
        seen.add(len(history))
    assert seen == {0, 1, 2, 3}
    path.write_bytes(b"not a W&B log")
    with pytest.raises(ValueError, match="not a W&B transaction log"):
        wandb_history(path)
