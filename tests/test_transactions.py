"""Commands as transactions and derived outputs with provenance (issue 28, items 1 and 2): a hand-edited config
is refused on resume, a stolen lock stops a run, a refused command leaves no lock and no folder, --overwrite
removes what was derived from the old weights, robust-eval entries name the epoch and the weights' checksum."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kdcollapse.cli import main
from kdcollapse.config import load_config
from kdcollapse.errors import CheckpointError, ConfigError
from kdcollapse.train import Trainer, fit

TINY = ["data.name=digits", "data.batch_size=64", "train.progress=false", "optim.lr=0.05", "schedule.name=constant",
        "model.name=mlp", "model.kwargs={input_size: 8, hidden: [16]}", "train.device=cpu"]


def tiny(run_dir, *extra):
    return load_config(None, [*TINY, f"run_dir={run_dir}", *extra])


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    return fit(tiny(tmp_path_factory.mktemp("tx") / "run", "train.epochs=1")).run_dir


def test_a_hand_edited_config_is_refused_on_resume(one_epoch, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    facts = json.loads((run_dir / "run.json").read_text())
    assert len(facts["config_sha256"]) == 64
    config = run_dir / "config.yaml"
    config.write_text(config.read_text().replace("lr: 0.05", "lr: 5.0"))
    assert main(["train", "--resume", str(run_dir), "train.epochs=2"]) == 2
    err = capsys.readouterr().err
    assert "config.yaml was edited after the run wrote it" in err and err.count("\n") == 1
    config.write_text(config.read_text().replace("lr: 5.0", "lr: 0.05"))  # restored: the resume goes on
    assert main(["train", "--resume", str(run_dir), "train.epochs=2", "--quiet"]) == 0
    resumed = json.loads((run_dir / "run.json").read_text())
    assert resumed["config_sha256"] != facts["config_sha256"] == resumed["config_sha256_previous"]


def test_a_stolen_lock_stops_the_run_before_its_next_commit(tmp_path):
    trainer = Trainer(tiny(tmp_path / "run", "train.epochs=2"))
    (tmp_path / "run" / ".lock").unlink()  # what lets a second trainer in
    with pytest.raises(CheckpointError, match=r"\.lock was removed or replaced while this process held it"):
        trainer.run()
    assert not (tmp_path / "run" / "state.json").exists()  # nothing committed


def test_a_lock_taken_over_by_a_second_process_stops_the_first(tmp_path):
    """The lock is the kernel's (flock) on the file this process opened, not the file's existence or its text:
    a deleted ``.lock`` lets a second trainer lock a new file, and the first notices before its next commit;
    while the first holds its file, a second is refused naming the holder (pid and host)."""
    import os

    from kdcollapse.runs import RunLock

    first = Trainer(tiny(tmp_path / "run", "train.epochs=1"))
    with pytest.raises(CheckpointError, match=rf"in use by another process \(pid {os.getpid()} on host"):
        RunLock(tmp_path / "run")
    (tmp_path / "run" / ".lock").write_text('{"pid": 1, "host": "elsewhere"}\n')  # text overwritten: still held
    with pytest.raises(CheckpointError, match="in use by another process"):
        RunLock(tmp_path / "run")
    (tmp_path / "run" / ".lock").unlink()
    second = RunLock(tmp_path / "run")  # a new file, locked by "another process"
    try:
        with pytest.raises(CheckpointError, match=r"\.lock was removed or replaced while this process held it"):
            first.run()
    finally:
        second.release()
    assert not (tmp_path / "run" / "state.json").exists()


def _flock_hook(monkeypatch, operation, action):
    """``fcntl.flock`` as the lock module calls it, running ``action(fd)`` once, at the first call with
    ``operation`` (before the real call for ``LOCK_EX``, after it for ``LOCK_UN``): a second process acting at
    that instant."""
    import fcntl

    from kdcollapse.runs import _lock

    real, pending = fcntl.flock, [True]

    def flock(fd, op):
        if pending[0] and op & operation:
            pending[0] = False
            if op & fcntl.LOCK_UN:
                real(fd, op)
                return action(fd)
            action(fd)
        return real(fd, op)

    monkeypatch.setattr(_lock.fcntl, "flock", flock)


def test_a_lock_file_removed_between_open_and_lock_is_not_held(tmp_path, monkeypatch):
    """A refused command removes the lock file it created (``release(undo=True)``) just after a second command
    opened it: the second must hold the file now at the path, not the removed one (else a third command
    creates and locks a new file, and two commands hold the directory)."""
    import fcntl

    from kdcollapse.runs import RunLock

    first = RunLock(tmp_path, owner=False)
    assert first.created
    _flock_hook(monkeypatch, fcntl.LOCK_EX, lambda fd: first.release(undo=True))
    second = RunLock(tmp_path)
    monkeypatch.undo()
    try:
        second.check()  # its file is run_dir/.lock
        with pytest.raises(CheckpointError, match=str(second.path.parent)):
            RunLock(tmp_path)  # a third command is refused
    finally:
        second.release()


def test_release_removes_the_lock_file_before_unlocking_it(tmp_path, monkeypatch):
    """A second command that locks in the instant the first unlocks holds a file nobody removes afterwards
    (unlocking before the removal would delete the second command's lock file under it)."""
    import fcntl

    from kdcollapse.runs import RunLock

    first, taken = RunLock(tmp_path, owner=False), []
    _flock_hook(monkeypatch, fcntl.LOCK_UN, lambda fd: taken.append(RunLock(tmp_path)))
    first.release(undo=True)
    monkeypatch.undo()
    (second,) = taken
    try:
        second.check()
        with pytest.raises(CheckpointError, match=str(second.path.parent)):
            RunLock(tmp_path)
    finally:
        second.release()


def test_a_refused_command_leaves_no_folder_and_no_lock(one_epoch, tmp_path):
    with pytest.raises(ConfigError, match="first training batch"):
        Trainer(tiny(tmp_path / "a" / "b" / "run", "model.kwargs={input_size: 9}"))
    assert not (tmp_path / "a").exists()
    lock = Path(one_epoch) / ".lock"
    before = lock.read_bytes(), lock.stat().st_mtime_ns
    with pytest.raises(ConfigError):  # the teacher's directory is read, never locked or written
        Trainer(tiny(tmp_path / "s", "method.name=kd", f"teacher.checkpoint={one_epoch}", "method.temperature=0"))
    assert (lock.read_bytes(), lock.stat().st_mtime_ns) == before and not (tmp_path / "s").exists()


def test_an_infinite_weight_is_refused_before_the_run_directory_changes(one_epoch, tmp_path):
    with pytest.raises(ConfigError, match="method.ce_weight must be a finite number >= 0, got inf"):
        Trainer(tiny(tmp_path / "s", "method.name=kd", f"teacher.checkpoint={one_epoch}", "method.ce_weight=.inf"))
    assert not (tmp_path / "s").exists()
    with pytest.raises(ConfigError, match="loss of the first training batch is (inf|nan)"):  # finite, overflows
        Trainer(tiny(tmp_path / "s", "method.name=kd", f"teacher.checkpoint={one_epoch}", "method.ce_weight=1e308"))
    assert not (tmp_path / "s").exists()
    Trainer(tiny(tmp_path / "s", "method.name=kd", f"teacher.checkpoint={one_epoch}")).release_run_dir()  # corrected


def test_robust_eval_records_provenance_and_overwrite_removes_derived_outputs(one_epoch, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    args = ["robust-eval", str(run_dir), "--attacks", "pgd", "--pgd-steps", "1", "--n-examples", "8", "--eps",
            "0.1", "--no-progress"]
    assert main(args) == 0
    (entry,) = json.loads((run_dir / "robust_eval.json").read_text()).values()
    state = json.loads((run_dir / "state.json").read_text())
    assert entry["epoch"] == 1 and entry["weights_sha256"] == state["files"]["model.safetensors"]["sha256"]
    assert main(["analyze", str(run_dir), "--no-progress"]) == 0
    report = json.loads((run_dir / "analysis_test" / "analysis.json").read_text())
    assert (report["epoch"], report["weights_sha256"]) == (1, entry["weights_sha256"])
    text = (run_dir / "robust_eval.json").read_text()
    (run_dir / "robust_eval.json").write_text(text[:-40])  # damaged: refused, never silently replaced
    capsys.readouterr()
    assert main(args) == 2
    assert "robust_eval.json is damaged" in capsys.readouterr().err
    assert (run_dir / "robust_eval.json").read_text() == text[:-40]
    assert main(["train", "--config", str(run_dir / "config.yaml"), f"run_dir={run_dir}", "seed=5", "--overwrite",
                 "--quiet"]) == 0
    assert not (run_dir / "robust_eval.json").exists() and not (run_dir / "analysis_test").exists()


def test_a_tampered_metrics_file_is_refused_by_run_and_plot(one_epoch, tmp_path, capsys):
    from kdcollapse.runs import Run

    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    assert Run(run_dir).metrics()[0]["epoch"] == 1
    path = run_dir / "metrics.jsonl"
    path.write_text(path.read_text().replace('"epoch": 1', '"epoch": 1, "test_acc_edited": 99.9'))
    with pytest.raises(CheckpointError, match="metrics.jsonl is not the file of epoch 1 that state.json records"):
        Run(run_dir).metrics()
    assert main(["plot", str(run_dir), "--out", str(tmp_path / "c.png")]) == 2
    assert "metrics.jsonl is not the file" in capsys.readouterr().err and not (tmp_path / "c.png").exists()


def test_a_run_that_died_before_its_first_commit_starts_again(tmp_path, capsys):
    run_dir = tmp_path / "run"
    trainer = Trainer(tiny(run_dir, "train.epochs=1"))  # config.yaml and run.json written, no epoch committed
    trainer.release_run_dir()
    assert (run_dir / "config.yaml").exists() and not (run_dir / "state.json").exists()
    assert main(["train", "--resume", str(run_dir)]) == 2
    assert "start it again with the same command without --resume" in capsys.readouterr().err
    assert fit(tiny(run_dir, "train.epochs=1")).epochs == 1  # the same command starts it cleanly


def test_a_refused_command_never_creates_its_folder(tmp_path, monkeypatch):
    """Not created and then removed: a folder that does not exist is only checked until the run starts."""
    import os

    made = []
    real = os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda path, *a, **kw: made.append(str(path)) or real(path, *a, **kw))
    with pytest.raises(ConfigError, match="first training batch"):
        Trainer(tiny(tmp_path / "a" / "run", "model.kwargs={input_size: 9}"))
    assert not [p for p in made if p.startswith(str(tmp_path / "a"))]
    (tmp_path / "file").write_text("")
    with pytest.raises(CheckpointError, match="cannot write to run directory .*file is not a directory"):
        Trainer(tiny(tmp_path / "file" / "run"))
    trainer = Trainer(tiny(tmp_path / "a" / "run"))  # the corrected command creates and locks it
    assert (tmp_path / "a" / "run" / ".lock").exists() and (tmp_path / "a" / "run" / "config.yaml").exists()
    trainer.release_run_dir()


def test_a_corrected_command_restarts_a_run_that_never_committed(tmp_path, capsys):
    """Stopped before its first commit (killed, diverged): nothing trained is there, so a corrected config
    starts again without --overwrite; a config.yaml that kdcollapse did not write is never replaced."""
    run_dir = tmp_path / "run"
    Trainer(tiny(run_dir, "train.epochs=1")).release_run_dir()  # config.yaml and run.json, no epoch committed
    result = fit(tiny(run_dir, "train.epochs=1", "optim.lr=0.02"))  # corrected: another learning rate
    assert result.epochs == 1 and load_config(run_dir / "config.yaml").optim.lr == 0.02
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("seed: 3\n")  # the user's own file, no run.json
    assert main(["train", "--config", str(run_dir / "config.yaml"), f"run_dir={mine}", "--quiet"]) == 2
    assert "already holds a run" in capsys.readouterr().err
    assert (mine / "config.yaml").read_text() == "seed: 3\n"


def test_a_full_disk_at_the_first_commit_says_to_run_the_same_command_again(tmp_path, monkeypatch, capsys):
    """Nothing is committed yet, so there is nothing to resume: the message says to run the same command again
    (not "resume it"), and that command then trains the run from the start."""
    import errno
    import os

    import kdcollapse.runs._checkpoint as checkpoint_module

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    run_dir = tmp_path / "run"
    config = tmp_path / "c.yaml"
    config.write_text("data: {name: digits, batch_size: 64}\nmodel: {name: mlp, kwargs: {input_size: 8, hidden: [16]}}"
                      "\noptim: {lr: 0.05}\nschedule: {name: constant}\ntrain: {epochs: 1, progress: false, device: cpu}\n")
    command = ["train", "--config", str(config), f"run_dir={run_dir}", "--quiet"]
    with monkeypatch.context() as m:
        m.setattr(checkpoint_module, "save_file", full)
        assert main(command) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "No space left on device" in err and "holds no committed epoch" in err
    assert "run the same command again (without --resume)" in err and "resume it" not in err
    assert not (run_dir / "state.json").exists()
    assert main(command) == 0  # the same command, space freed
    assert json.loads((run_dir / "state.json").read_text())["epoch"] == 1
