"""Ctrl-C (SIGINT) during training (issue 42): the process ends with the one line ``interrupted`` and exit
130, leaves a run directory whose committed epoch is whole and whose lock is free, and ``--resume`` continues
it exactly as an uninterrupted run. The instants are drawn (seeded) over the epochs after the first commit, so
some land inside an epoch's commit."""

import random
import signal
import time
from pathlib import Path

import pytest

from test_faults import MLP, assert_consistent, assert_same_run, resume, tiny, weights
from kdcollapse.train import fit


@pytest.mark.slow
@pytest.mark.parametrize("instant", [0, 1])
def test_sigint_ends_in_one_line_and_the_run_resumes_exactly(tmp_path, instant):
    from ranks import Forked

    (tmp_path / "empty.yaml").write_text("{}\n")
    run_dir = tmp_path / "run"
    child = Forked(["train", "--config", str(tmp_path / "empty.yaml"), *MLP, "train.epochs=100000",
                    f"run_dir={run_dir}"], tmp_path / "err")
    try:
        deadline = time.time() + 120
        while not (run_dir / "checkpoint.safetensors").exists():
            assert child.poll() is None and time.time() < deadline, child.stderr()[-2000:]
            time.sleep(0.005)
        time.sleep(random.Random(instant).uniform(0.0, 0.3))
        child.send_signal(signal.SIGINT)
        assert child.wait() == 130, child.stderr()[-2000:]
    finally:
        if child.poll() is None:
            child.send_signal(signal.SIGKILL)
            child.wait()
    lines = [line for line in child.stderr().splitlines() if not line.startswith("epoch ")]
    assert lines == ["interrupted"], lines
    reached = weights(run_dir, "checkpoint.safetensors")[1]["epoch"]
    resume(run_dir, reached + 1)  # the lock is free; an epoch interrupted in its commit is completed or discarded
    assert_consistent(run_dir)
    reference = fit(tiny(tmp_path / "reference", f"train.epochs={reached + 1}")).run_dir
    assert_same_run(reference, run_dir, reached + 1)


def test_an_interrupt_just_after_the_commit_point_keeps_the_committed_epoch(tmp_path, monkeypatch):
    """The window the test above can land in: Ctrl-C in the directory fsync right after ``state.json`` was
    replaced. The epoch is committed then; its staged files must survive the interruption for ``--resume`` to
    put in place (they used to be removed with the uncommitted ones, leaving state.json naming nothing)."""
    import os

    import kdcollapse.runs._atomic as atomic

    straight = fit(tiny(tmp_path / "straight", "train.epochs=2")).run_dir
    run_dir = fit(tiny(tmp_path / "run", "train.epochs=1")).run_dir
    real_replace, real_fsync, last = os.replace, atomic.fsync_dir, {}

    def replace(src, dst):
        real_replace(src, dst)
        last["name"] = Path(dst).name

    def fsync_dir(path):
        if last.pop("name", None) == "state.json":
            raise KeyboardInterrupt
        real_fsync(path)

    with monkeypatch.context() as m:
        m.setattr(os, "replace", replace)
        m.setattr(atomic, "fsync_dir", fsync_dir)
        with pytest.raises(KeyboardInterrupt):
            resume(run_dir, 2)
    assert weights(run_dir, "checkpoint.safetensors")[1]["epoch"] == 1  # not yet renamed into place
    resume(run_dir, 2)  # puts the committed epoch in place; trains nothing more
    assert_consistent(run_dir)
    assert_same_run(straight, run_dir, 2)
