"""The crash test of tests/test_faults.py on a language-model run (issue 38: the kill -9 tests cover LM runs as
image runs): a distill-lm run (tiny teacher and student of tests/tiny_lm.py) stopped at every write point of its
commits (the directory copied as kill -9 would leave it) resumes to a run identical, tensor for tensor and record
for record, to one that never stopped."""

from __future__ import annotations

import errno
import json
import os
import shutil

import pytest
import torch

import kdcollapse.runs._checkpoint as checkpoint_module
from kdcollapse import lm
from kdcollapse.errors import CheckpointError
from kdcollapse.train import TrainingDiverged
from kdcollapse.train._lm_task import LMTask
from kdcollapse.runs import load_tensors, read_metrics
from kdcollapse.train import distill_lm, load_lm_config

pytest.importorskip("transformers")
pytest.importorskip("tokenizers")
from naming import raises_naming  # noqa: E402
from test_faults import Crash, crashed_copies  # noqa: E402
from tiny_lm import distill_lm_files  # noqa: E402


@pytest.fixture(scope="module")
def options(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_faults")
    _, files = distill_lm_files(root, teacher_hidden=32, copies=6)
    return root, [*files, "block_size=8", "train_blocks=20", "eval_blocks=2",
                  "batch_size=2", "eval_every=2", "warmup=1", "log_every=1", "progress=false"]


def run(options, run_dir, steps, resume=False):
    cfg = (load_lm_config(run_dir / "config.yaml", [f"steps={steps}"]) if resume else
           load_lm_config(None, [*options, f"run_dir={run_dir}", f"steps={steps}"]))
    cfg.run_dir = str(run_dir)  # the directory may have been copied
    return distill_lm(cfg, resume=resume, log=lambda *_: None)


def assert_same_run(a, b, steps):
    (ta, ma), (tb, mb) = load_tensors(a / "checkpoint.safetensors"), load_tensors(b / "checkpoint.safetensors")
    assert mb["step"] == steps and ma["step"] == mb["step"]
    assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta)
    strip = lambda records: [{k: v for k, v in r.items() if k != "step_seconds"} for r in records]  # noqa: E731
    assert strip(read_metrics(b)) == strip(read_metrics(a)) and [r["step"] for r in read_metrics(b)] == [2, 4, 6]
    assert (b / "steps.jsonl").read_text() == (a / "steps.jsonl").read_text()
    assert not list(b.glob("*.tmp")) and not list(b.glob(".*.tmp"))


@pytest.mark.slow
def test_a_crash_at_any_write_point_of_an_lm_commit_resumes_bit_identically(options, tmp_path, monkeypatch):
    root, opts = options
    straight, part = tmp_path / "straight", tmp_path / "part"
    run(opts, straight, 6)
    run(opts, part, 2)
    # the same run (its cosine schedule ends at step 6) crashed at each write point of the commits of steps 4 and 6
    for snapshot in crashed_copies(part, tmp_path, monkeypatch, lambda run_dir: run(opts, run_dir, 6, resume=True)):
        run(opts, snapshot, 6, resume=True)
        assert_same_run(straight, snapshot, 6)


@pytest.mark.slow
def test_a_full_disk_at_an_lm_commit_says_what_the_run_directory_still_holds(options, tmp_path, monkeypatch):
    """The run engine's commit is the image runs' one: a full disk commits nothing and says how to go on."""
    _, opts = options

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_module, "save_file", full)
    with raises_naming(CheckpointError, "No space left on device", "step 2", "no committed step",
                       "run the same command again"):
        run(opts, tmp_path / "run", 2)
    assert not (tmp_path / "run" / "state.json").exists()
    monkeypatch.undo()
    run(opts, tmp_path / "run", 2)  # the same command, space freed
    monkeypatch.setattr(checkpoint_module, "save_file", full)
    with raises_naming(CheckpointError, "step 4", "still holds step 2", "resume it"):
        run(opts, tmp_path / "run", 4, resume=True)
    monkeypatch.undo()
    assert json.loads((tmp_path / "run" / "state.json").read_text())["epoch"] == 2


@pytest.mark.slow
def test_a_diverged_lm_run_says_what_it_kept_as_an_image_run_does(options, tmp_path, monkeypatch):
    """The loss made NaN (a fault injected into the task's loss): ``TrainingDiverged`` with the run engine's
    account of the last commit, before any commit and after a resume."""
    _, opts = options
    real = LMTask.loss
    monkeypatch.setattr(LMTask, "loss", lambda self, *args: real(self, *args) * float("nan"))
    with raises_naming(TrainingDiverged, "nan", "step 1", "no step had been committed", "without --resume"):
        run(opts, tmp_path / "run", 2)
    monkeypatch.undo()
    run(opts, tmp_path / "run", 2)  # the corrected command starts it again
    monkeypatch.setattr(LMTask, "loss", lambda self, *args: real(self, *args) * float("nan"))
    with raises_naming(TrainingDiverged, "step 3", "after step 2", str(tmp_path / "run")):
        run(opts, tmp_path / "run", 4, resume=True)


def test_a_crash_at_any_write_of_the_teacher_token_cache_is_refused_then_rebuilt_identically(tmp_path, monkeypatch):
    """The teacher-token cache (issue 42): killed at any of its file writes (each shard, its rename, the
    manifest), the directory is refused by ``TeacherTokens.load`` in one line (no manifest, or a shard that is
    not the manifest's) and the next ``store_teacher_tokens`` finishes it into the bytes of a store that was
    never interrupted."""
    import kdcollapse.lm._tokens as tokens_module
    from kdcollapse.errors import KdcollapseError
    from tiny_lm import llama_config, tiny_tokenizer, write_corpus

    tokenizer = tiny_tokenizer()
    corpus = lm.tokenize_corpus(tokenizer, write_corpus(tmp_path / "text", copies=2), cache_dir=tmp_path / "cache")
    model = lm.load_language_model(llama_config(len(tokenizer)), tokenizer=tokenizer, seed=1).model
    blocks = corpus["train"].blocks(8)[:6]
    store = lambda directory: lm.store_teacher_tokens(model, blocks, directory, k=5, shard_blocks=2)  # noqa: E731
    clean = store(tmp_path / "clean")
    expected = {p.name: p.read_bytes() for p in clean.iterdir()}

    class Crash(BaseException):
        pass

    point, points = 0, None
    while points is None:
        count, directory = {"n": 0}, tmp_path / f"crashed{point}"

        def hook(real):
            def wrapped(*args, **kwargs):
                if count["n"] == point:
                    raise Crash
                count["n"] += 1
                return real(*args, **kwargs)
            return wrapped

        with monkeypatch.context() as m:
            m.setattr(tokens_module, "save_file", hook(tokens_module.save_file))
            m.setattr(tokens_module.os, "replace", hook(os.replace))
            try:
                store(directory)
                points = count["n"]  # no crash: every write point was tried
                continue
            except Crash:
                pass
        if directory.exists():
            with pytest.raises(KdcollapseError) as refused:
                lm.TeacherTokens.load(directory)
            assert "\n" not in str(refused.value), refused.value
        store(directory)
        assert {p.name: p.read_bytes() for p in directory.iterdir()} == expected, point
        point += 1
    assert points >= 7  # three shards and their renames, the manifest's rename


def test_a_killed_then_resumed_lm_run_commits_the_cpu_seconds_of_all_its_committed_parts(options, tmp_path,
                                                                                        monkeypatch):
    """``cpu_seconds`` in the checkpoint's meta: the first launch's part up to its last commit plus the resumed
    launch's (a launch stopped as kill -9 would stop it, before the commit of step 4); a run begun by a version that
    kept no CPU time counts from the step it resumed at and says so; the study step reads the total back."""
    import time

    from kdcollapse.runs import committed_path, read_header
    from kdcollapse.study._steps import run_cpu_seconds
    from kdcollapse.train._lm import LMTrainer

    _, opts = options
    meta = lambda d: read_header(committed_path(d, "checkpoint.safetensors"))[0]  # noqa: E731
    killed, snapshot = tmp_path / "killed", tmp_path / "snapshot"
    real = LMTrainer.commit_step

    def killed_at_step_4(self, step, record):  # the directory as kill -9 leaves it just before step 4's commit
        if step == 4:
            shutil.copytree(killed, snapshot)
            raise Crash
        real(self, step, record)

    with monkeypatch.context() as m:
        m.setattr(LMTrainer, "commit_step", killed_at_step_4)
        began = time.process_time()
        with pytest.raises(Crash):
            run(opts, killed, 6)
        first = time.process_time() - began
    part = meta(snapshot)
    assert part["step"] == 2 and part["cpu_seconds_from_step"] == 0 and 0 < part["cpu_seconds"] <= first
    began = time.process_time()
    run(opts, snapshot, 6, resume=True)
    second = time.process_time() - began
    whole = meta(snapshot)
    assert whole["step"] == 6 and whole["cpu_seconds_from_step"] == 0
    assert part["cpu_seconds"] < whole["cpu_seconds"] <= part["cpu_seconds"] + second
    assert run_cpu_seconds(snapshot, None) == {"cpu_seconds": whole["cpu_seconds"], "cpu_seconds_from_step": 0}

    old = tmp_path / "old"  # a checkpoint of a version that kept no CPU time
    with monkeypatch.context() as m:
        m.setattr(LMTrainer, "cpu_seconds", lambda self: {})
        run(opts, old, 2)
    assert "cpu_seconds" not in meta(old)
    assert set(run_cpu_seconds(old, None)) == {"cpu_seconds_counted"}  # read, not trained here: no number
    assert run_cpu_seconds(old, 1.5) == {"cpu_seconds": 1.5, "cpu_seconds_counted": "this launch only: its "
                                         "checkpoint keeps no CPU time (an older version)"}
    began = time.process_time()
    run(opts, old, 4, resume=True)
    resumed = meta(old)
    assert resumed["cpu_seconds_from_step"] == 2 and 0 < resumed["cpu_seconds"] <= time.process_time() - began
