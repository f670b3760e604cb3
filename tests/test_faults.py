"""Runs that cannot be lost or corrupted: crashes at every write point, kill -9, a full disk, tampered and
flipped files, torn metrics, two processes, refused resume overrides, --overwrite typos, the teacher's
directory, and divergence in an epoch's last step. Every case is checked with the public API or the CLI."""

import errno
import json
import os
import shutil
import signal
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import kdcollapse.runs._checkpoint as checkpoint_module
from kdcollapse.cli import main
from kdcollapse.config import TeacherConfig, load_config
from kdcollapse.errors import CheckpointError
from kdcollapse.methods import Method, register_method
from kdcollapse.runs import Run, load_model, load_teacher, load_tensors, metrics_csv, read_metrics, save_tensors
from kdcollapse.train import TrainingDiverged, fit

MLP = ["data.name=digits", "data.batch_size=256", "train.progress=false", "optim.lr=0.05",
       "schedule.name=constant", "model.name=mlp", "model.kwargs={input_size: 8, hidden: [16]}"]


def tiny(run_dir, *extra):
    return load_config(None, [*MLP, f"run_dir={run_dir}", *extra])


def resume(run_dir, epochs):
    overrides = [f"train.epochs={epochs}", f"run_dir={run_dir}"]  # the directory may have been copied
    return fit(load_config(Path(run_dir) / "config.yaml", overrides), resume=True)


def weights(run_dir, name):
    return load_tensors(Path(run_dir) / name)


def files(run_dir):
    """Every file of a run directory (bytes), to prove that nothing changed."""
    return {p.relative_to(run_dir).as_posix(): p.read_bytes() for p in sorted(Path(run_dir).rglob("*"))
            if p.is_file() and p.name != ".lock"}


def assert_same_run(a, b, epochs):
    """Two run directories hold the same run after ``epochs`` epochs, tensor for tensor."""
    for name in ("checkpoint.safetensors", "model.safetensors", "best.safetensors"):
        (ta, ma), (tb, mb) = weights(a, name), weights(b, name)
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), name
        assert ma["epoch"] == mb["epoch"], name
    assert weights(b, "checkpoint.safetensors")[1]["epoch"] == epochs
    ra, rb = read_metrics(a), read_metrics(b)
    assert [r["epoch"] for r in rb] == list(range(1, epochs + 1))
    timing = {"images_per_s", "epoch_time_s"}
    assert [{k: v for k, v in r.items() if k not in timing} for r in ra] == \
           [{k: v for k, v in r.items() if k not in timing} for r in rb]
    assert not list(Path(b).glob("*.tmp")) and not list(Path(b).glob(".*.tmp"))
    assert (Path(b) / "metrics.csv").read_text() == metrics_csv(rb)  # the same records as metrics.jsonl


def assert_consistent(run_dir):
    """The weight files agree with the checkpoint: model = its epoch, best = its best epoch."""
    _, meta = weights(run_dir, "checkpoint.safetensors")
    assert weights(run_dir, "model.safetensors")[1]["epoch"] == meta["epoch"]
    assert weights(run_dir, "best.safetensors")[1]["epoch"] == meta["best_epoch"]
    assert max(r["epoch"] for r in read_metrics(run_dir)) == meta["epoch"]
    assert (Path(run_dir) / "metrics.csv").read_text() == metrics_csv(read_metrics(run_dir))


@pytest.fixture(scope="module")
def empty_yaml(tmp_path_factory):
    path = tmp_path_factory.mktemp("config") / "empty.yaml"
    path.write_text("{}\n")
    return str(path)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """3 uninterrupted epochs (every epoch improves here, so every epoch writes best.safetensors)."""
    run = fit(tiny(tmp_path_factory.mktemp("straight") / "run", "train.epochs=3"))
    accuracies = [r["test_acc"] for r in read_metrics(run.run_dir)]
    assert accuracies == sorted(accuracies)
    return run.run_dir


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory):
    return fit(tiny(tmp_path_factory.mktemp("one") / "run", "train.epochs=1")).run_dir


class Crash(BaseException):
    """Stands for kill -9: not an Exception, so no handler of the library catches it."""


def crash_at(monkeypatch, run_dir, point, snapshot):
    """Count the file writes (safetensors files) and renames of a run; at write point ``point`` copy the run
    directory as it is at that instant (what kill -9 would leave) to ``snapshot`` and stop."""
    count = {"n": 0}
    save_file, replace = checkpoint_module.save_file, os.replace

    def hook(real):
        def wrapped(*args, **kwargs):
            if count["n"] == point:
                shutil.copytree(run_dir, snapshot)
                raise Crash
            count["n"] += 1
            return real(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(checkpoint_module, "save_file", hook(save_file))
    monkeypatch.setattr(os, "replace", hook(replace))
    return count


def crashed_copies(start, tmp_path, monkeypatch, go_on=lambda run_dir: resume(run_dir, 2)):
    """Copies of the run directory ``start``, each with ``go_on(copy)`` (by default the resume of a one-epoch run
    to epoch 2) crashed at one write point (every point in turn): the directory as the crash left it. A point
    where nothing had been written yet yields nothing. Image and LM runs (tests/test_faults_lm.py) alike."""
    point, points = 0, None
    while points is None or point < points:
        run_dir, snapshot = tmp_path / f"run{point}", tmp_path / f"crashed{point}"
        shutil.copytree(start, run_dir)
        with monkeypatch.context() as m:
            count = crash_at(m, run_dir, point, snapshot)
            try:
                go_on(run_dir)
                points = count["n"]  # no crash: every write point was tried
            except Crash:
                pass
        point += 1
        if snapshot.exists():
            yield snapshot
    assert points >= 6  # an epoch's checkpoint, model and best files, their renames (and more); an LM run's
    # checkpoint file, its renames and the metrics files, in two commits


def test_a_crash_at_any_write_point_of_an_epoch_resumes_consistently_and_bit_identically(
        straight, one_epoch, tmp_path, monkeypatch):
    for snapshot in crashed_copies(one_epoch, tmp_path, monkeypatch):
        resume(snapshot, 2)
        assert_consistent(snapshot)
        resume(snapshot, 3)
        assert_same_run(straight, snapshot, 3)


def test_run_reads_the_committed_epoch_between_a_crash_and_resume(one_epoch, straight, tmp_path, monkeypatch):
    """A reader (``Run``) after a crash at any write point of epoch 2 sees exactly the epoch state.json
    committed, changes nothing, and sees what the resume then makes of the directory."""
    seen = set()
    for snapshot in crashed_copies(one_epoch, tmp_path, monkeypatch):
        committed = json.loads((snapshot / "state.json").read_text())["epoch"]
        live = weights(snapshot, "model.safetensors")[1]["epoch"]
        before = files(snapshot)
        run = Run(snapshot)
        model, meta = run.model()
        assert meta["epoch"] == committed and [r["epoch"] for r in run.metrics()] == list(range(1, committed + 1))
        assert run.model("best")[1]["epoch"] == committed and files(snapshot) == before
        assert load_model(snapshot)[1]["epoch"] == committed  # so does a teacher (teacher.checkpoint=DIR)
        teacher = load_teacher(TeacherConfig(checkpoint=str(snapshot)), run.dataset("test")).model
        assert all(torch.equal(v, teacher.state_dict()[k]) for k, v in model.state_dict().items())
        seen.add((committed, live))
        resume(snapshot, committed)  # repairs only: the run has its epochs
        again = Run(snapshot).model()[0].state_dict()
        assert all(torch.equal(v, again[k]) for k, v in model.state_dict().items())
    assert (2, 1) in seen and (1, 1) in seen  # committed with the old files still in place; not yet committed


def test_a_weight_file_that_is_not_the_committed_one_is_refused_until_resume(one_epoch, straight, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    shutil.copy(Path(straight) / "model.safetensors", run_dir / "model.safetensors")  # epoch 3 over epoch 1
    with pytest.raises(CheckpointError, match="model.safetensors is not the file of epoch 1 that state.json records"
                                              ".*run `kdcollapse train --resume .*` to repair it"):
        Run(run_dir).model()
    dataset = Run(one_epoch).dataset("test")
    for read in (lambda: load_model(run_dir), lambda: load_teacher(TeacherConfig(checkpoint=str(run_dir)), dataset)):
        with pytest.raises(CheckpointError, match="not the file of epoch 1 that state.json records"):
            read()
    assert [r["epoch"] for r in Run(run_dir).metrics()] == [1]
    resume(run_dir, 1)
    assert Run(run_dir).model()[1]["epoch"] == 1


# The checkpoint also holds AdamW's moments, a torch schedule's state and the weight average; accumulation
# changes where optimizer steps fall. A kill -9 must lose none of it. (Plain SGD's resume after a crash at
# every write point is test_a_crash_at_any_write_point_of_an_epoch_resumes_consistently_and_bit_identically;
# the kill, the lock and the commit do not depend on the optimizer, so one kill -9 run covers them.)
OPTIMISERS = ["optim.name=adamw", "optim.lr=0.01", "optim.accumulate=2", "train.ema=0.9", "schedule.name=StepLR",
              "schedule.kwargs={step_size: 1, gamma: 0.9}"]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [OPTIMISERS], ids=["adamw-steplr-accumulate-ema"])
def test_kill_9_during_training_then_a_second_process_and_resume(tmp_path, empty_yaml, extra, capsys):
    """A real SIGKILL at an arbitrary moment after the first epoch; meanwhile (the first process frozen with
    SIGSTOP, holding its lock) a second process (this one) is refused. The killed process's lock does not block
    the resume, which continues exactly as an uninterrupted run. The first process is a fork of this one
    (tests/ranks.py: no interpreter start-up and import of torch)."""
    from ranks import Forked

    run_dir = tmp_path / "run"
    proc = Forked(["train", "--config", empty_yaml, *MLP, *extra, "train.epochs=100000", f"run_dir={run_dir}"],
                  tmp_path / "first.err")
    try:
        deadline = time.time() + 120
        while not (run_dir / "checkpoint.safetensors").exists():
            assert proc.poll() is None and time.time() < deadline, proc.stderr()[-2000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGSTOP)
        capsys.readouterr()
        assert main(["train", "--config", empty_yaml, *MLP, "--overwrite", f"run_dir={run_dir}"]) == 2
        err = capsys.readouterr().err
        assert f"is in use by another process (pid {proc.pid} on host" in err, err[-2000:]
        assert "Traceback" not in err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr()[-2000:]  # killed, not ended on its own
    resume(run_dir, 1)  # completes or discards the epoch being committed at the kill, trains nothing
    reached = weights(run_dir, "checkpoint.safetensors")[1]["epoch"]
    resume(run_dir, reached + 1)
    assert_consistent(run_dir)
    reference = fit(tiny(tmp_path / "reference", *extra, f"train.epochs={reached + 1}")).run_dir
    assert_same_run(reference, run_dir, reached + 1)


def test_a_full_disk_saves_nothing_of_the_epoch_and_says_so(straight, one_epoch, tmp_path, monkeypatch):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    before = files(run_dir)

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    for writer in ("save_file",):
        with monkeypatch.context() as m:
            m.setattr(checkpoint_module, writer, full)
            with pytest.raises(CheckpointError, match=r"cannot write .*checkpoint.safetensors: No space left on "
                                                      r"device; nothing of epoch 2 was saved"):
                resume(run_dir, 2)
    after = files(run_dir)  # the resume's config (train.epochs) and its SHA-256 in run.json are written first
    assert {k: v for k, v in after.items() if k not in ("config.yaml", "run.json")} == \
           {k: v for k, v in before.items() if k not in ("config.yaml", "run.json")}
    resume(run_dir, 3)
    assert_same_run(straight, run_dir, 3)


@pytest.mark.parametrize("tamper, message", [
    (lambda t, m: m.pop("optimizer"), "'optimizer' is missing"),
    (lambda t, m: m.update(epoch="3"), "'epoch' is str '3'"),
    (lambda t, m: m.update(best_epoch=7), "best epoch 7"),
    (lambda t, m: t.update({"optim.0.momentum_buffer": torch.zeros(3)}), "momentum_buffer of parameter 0 has shape"),
    (lambda t, m: t.update({"optim.99.momentum_buffer": torch.zeros(3)}), "names parameter '99.momentum_buffer'"),
])
def test_tampered_checkpoint_metadata_is_a_one_line_error(one_epoch, tmp_path, tamper, message):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    (run_dir / "state.json").unlink(missing_ok=True)  # as a run directory of an older version
    tensors, meta = weights(run_dir, "checkpoint.safetensors")
    tamper(tensors, meta)
    save_tensors(run_dir / "checkpoint.safetensors", tensors, meta)
    with pytest.raises(CheckpointError, match=message):
        resume(run_dir, 2)


def test_a_replaced_checkpoint_is_refused_when_state_json_records_another(one_epoch, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    tensors, meta = weights(run_dir, "checkpoint.safetensors")
    save_tensors(run_dir / "checkpoint.safetensors", {k: v + 1 for k, v in tensors.items()}, meta)
    with pytest.raises(CheckpointError, match="is not the checkpoint of epoch 1 that state.json records"):
        resume(run_dir, 2)


def flip_a_data_byte(path):
    data = bytearray(path.read_bytes())
    header = int.from_bytes(data[:8], "little")
    data[8 + header + 5] ^= 0x10
    path.write_bytes(bytes(data))


def test_a_flipped_bit_in_tensor_data_is_detected(one_epoch, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    flip_a_data_byte(run_dir / "model.safetensors")
    with pytest.raises(CheckpointError, match="model.safetensors is corrupt"):
        load_model(run_dir)
    flip_a_data_byte(run_dir / "checkpoint.safetensors")
    (run_dir / "state.json").unlink()
    with pytest.raises(CheckpointError, match="checkpoint.safetensors is corrupt"):
        resume(run_dir, 2)


def test_a_torn_last_metrics_line_is_reported_and_dropped(straight, one_epoch, tmp_path, capsys):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"epoch": 2, "train_lo')
    with pytest.warns(UserWarning, match="ignoring its last line 2, which is torn"):
        assert [r["epoch"] for r in read_metrics(run_dir)] == [1]
    with pytest.warns(UserWarning, match="torn"):
        assert main(["plot", str(run_dir), "--out", str(tmp_path / "curves.png")]) == 0
    with pytest.warns(UserWarning, match="torn"):
        resume(run_dir, 3)
    assert_same_run(straight, run_dir, 3)
    (run_dir / "metrics.jsonl").write_text('{"epoch": 1}\nnot json\n{"epoch": 3}\n')
    with pytest.raises(CheckpointError, match="line 2 is not a JSON record"):
        read_metrics(run_dir)


@pytest.mark.parametrize("override", ["seed=1", "data.name=fashion_mnist", "data.train_per_class=5",
                                      "model.kwargs={input_size: 8, hidden: [32]}", "method.name=kd",
                                      "optim.lr=0.1", "teacher.checkpoint=elsewhere"])
def test_resume_refuses_overrides_that_change_the_run(one_epoch, tmp_path, capsys, override):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    before = files(run_dir)
    assert main(["train", "--resume", str(run_dir), override]) == 2
    err = capsys.readouterr().err
    assert f"cannot resume: the run was trained with {override.split('=')[0]}" in err or \
           "cannot resume: the run was trained with" in err, err
    assert "Traceback" not in err
    assert files(run_dir) == before


def test_resume_accepts_run_length_eval_and_logging_overrides(one_epoch, tmp_path):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    assert main(["train", "--resume", str(run_dir), "train.epochs=2", "train.eval_every=2",
                 "data.eval_batch_size=100", "analysis.every=0"]) == 0
    assert load_config(run_dir / "config.yaml").train.eval_every == 2


@pytest.mark.parametrize("typo, message", [
    (["data.name=fashion_mnist", "data.root=/no/such/dir"], "/no/such/dir"),
    (["model.kwargs={input_size: 8, hiden: [16]}"], "hiden"),
    (["model.name=resnet9"], "unknown model 'resnet9'"),
    (["method.name=kd", "teacher.checkpoint=/no/such/teacher"], "/no/such/teacher"),
])
def test_overwrite_with_a_typo_leaves_the_old_run_untouched(one_epoch, tmp_path, capsys, empty_yaml, typo, message):
    run_dir = tmp_path / "run"
    shutil.copytree(one_epoch, run_dir)
    before = files(run_dir)
    assert main(["train", "--config", empty_yaml, *MLP, f"run_dir={run_dir}", "--overwrite", *typo]) == 2
    assert "Traceback" not in capsys.readouterr().err
    assert files(run_dir) == before


def test_overwrite_never_deletes_the_teacher(one_epoch, tmp_path, capsys, empty_yaml):
    teacher = tmp_path / "runs" / "teacher"
    shutil.copytree(one_epoch, teacher)
    before = files(teacher)
    for run_dir in (teacher, teacher.parent):
        (run_dir / "config.yaml").exists() or shutil.copy(teacher / "config.yaml", run_dir / "config.yaml")
        code = main(["distill", "--config", empty_yaml, *MLP, "method.name=kd", f"teacher.checkpoint={teacher}",
                     f"run_dir={run_dir}", "--overwrite"])
        assert code == 2
        assert "holds this run's teacher" in capsys.readouterr().err
        assert files(teacher) == before


@register_method("_blows_up_in_the_last_step")
class BlowsUpInTheLastStep(Method):
    """Epoch 2's last step sends the weights (``where="weights"``) or the test logits (``"eval"``) to
    non-finite values after the loss of that step was computed, as a too-large last update would."""

    @dataclass
    class Config:
        where: str = "weights"

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        self.where, self.steps, self.step = config.where, None, 0

    def on_epoch_start(self, epoch):
        super().on_epoch_start(epoch)
        self.step = 0

    def forward(self, x, y):
        logits = self.student(x)
        return {"loss": self.cross_entropy(logits, y), "logits": logits}

    def on_epoch_end(self, epoch):
        self.steps = self.steps or self.step

    def after_step(self):
        self.step += 1
        if self.where == "weights" and self.epoch == 1 and self.step == self.steps:
            with torch.no_grad():
                next(self.student.parameters()).fill_(float("inf"))

    def predict(self, x):
        logits = super().predict(x)
        return logits * float("nan") if self.where == "eval" and self.epoch == 1 else logits


@pytest.mark.parametrize("where, message", [("weights", r"after epoch 2 the weights \(.*\) are not finite"),
                                            ("eval", "after epoch 2 the test loss is nan")])
def test_a_blow_up_in_the_last_step_is_not_saved_as_a_good_checkpoint(tmp_path, where, message):
    cfg = tiny(tmp_path / "run", "train.epochs=3", "method.name=_blows_up_in_the_last_step",
               f"method.where={where}")
    with pytest.raises(TrainingDiverged, match=message + r".*not saved.*last good checkpoint \(after epoch 1\)"):
        fit(cfg)
    for name in ("checkpoint.safetensors", "model.safetensors", "best.safetensors"):
        tensors, meta = weights(cfg.run_dir, name)
        assert meta["epoch"] == 1 and all(torch.isfinite(t).all() for t in tensors.values()), name
    assert [r["epoch"] for r in read_metrics(cfg.run_dir)] == [1]
