"""The trainer on real (tiny) data: exact resume, DDP sync, divergence, run-directory safety."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kdcollapse.cli import main
from kdcollapse.config import load_config
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.methods import Method, register_method
from kdcollapse.train import fit
from kdcollapse.runs import load_model, load_tensors, read_metrics
from kdcollapse.train import TrainingDiverged

# How these runs differ from the tiny run (conftest.py): every digit, the mlp's default hidden layers.
RUN = ["data.batch_size=64", "data.train_per_class=null", "data.test_per_class=null", "model.kwargs={input_size: 8}"]


@pytest.fixture
def tiny(tiny_config, tmp_path):
    """``tiny(*overrides, name="run")``: this module's run config, writing to ``tmp_path / name``."""
    return lambda *overrides, name="run": tiny_config(tmp_path / name, *RUN, *overrides)


def state_of(run_dir):
    tensors, _ = load_tensors(Path(run_dir) / "checkpoint.safetensors")
    return tensors


@register_method("_nan_at_epoch_2_step_3")
class NanAtEpoch2Step3(Method):
    @dataclass
    class Config:
        pass

    def on_epoch_start(self, epoch):
        super().on_epoch_start(epoch)
        self.step = 0

    def forward(self, x, y):
        logits = self.student(x)
        loss = self.cross_entropy(logits, y)
        self.step += 1
        if self.epoch == 1 and self.step == 3:
            loss = loss * float("nan")
        return {"loss": loss, "logits": logits}


def test_resume_continues_exactly(tmp_path, tiny):
    # BN buffers, momentum, augmentation and shuffling all have to line up for bitwise equality.
    common = ["model.name=convnet_small", "model.kwargs={}", "data.crop_padding=1", "data.flip=true",
              "schedule.name=multistep", "schedule.milestones=[2]"]
    straight = fit(tiny(*common, "train.epochs=4", name="straight"))
    fit(tiny(*common, "train.epochs=2", name="split"))
    resumed_cfg = load_config(tmp_path / "split" / "config.yaml", ["train.epochs=4"])
    resumed = fit(resumed_cfg, resume=True)
    a, b = state_of(straight.run_dir), state_of(resumed.run_dir)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert [r["epoch"] for r in read_metrics(resumed.run_dir)] == [1, 2, 3, 4]
    assert straight.last_acc == resumed.last_acc
    assert straight.last_acc > 60  # it does learn digits


def test_run_dir_safety(tmp_path, tiny):
    cfg = tiny("train.epochs=1")
    fit(cfg)
    with pytest.raises(CheckpointError, match="already holds a run.*--resume.*--overwrite"):
        fit(cfg)
    (cfg_dir := Path(cfg.run_dir)).joinpath("notes.txt").write_text("mine")
    fit(cfg, overwrite=True)
    assert (cfg_dir / "notes.txt").read_text() == "mine"  # --overwrite removes only the run's own files
    with pytest.raises(CheckpointError, match="holds no checkpoint"):
        fit(tiny(name="empty"), resume=True)
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(CheckpointError, match="cannot write to run directory"):
        fit(tiny(name="file/sub"))


def test_resume_refuses_another_model(tmp_path, tiny):
    cfg = tiny("train.epochs=1")
    fit(cfg)
    other = load_config(Path(cfg.run_dir) / "config.yaml", ["model.name=convnet_small", "model.kwargs={}"])
    with pytest.raises(KdcollapseError, match="cannot resume: .*model.name='mlp'.*model.name='convnet_small'"):
        fit(other, resume=True)


def test_model_file_roundtrip_and_mismatch(tmp_path, tiny):
    run = fit(tiny("train.epochs=1"))
    model, meta = load_model(run.run_dir)
    assert meta["dataset"] == "digits" and meta["num_classes"] == 10 and meta["model"] == "mlp"
    with pytest.raises(CheckpointError, match="holds a 'mlp', not a 'convnet_small'"):
        load_model(run.run_dir, model_name="convnet_small")
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 40)
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        load_model(tmp_path / "junk.safetensors")


def test_bad_input_errors(tmp_path, tiny):
    with pytest.raises(KdcollapseError, match="unknown model 'resnet9'.*Valid choices"):
        fit(tiny("model.name=resnet9"))
    with pytest.raises(KdcollapseError, match="unknown dataset 'cifar11'.*Valid choices"):
        fit(tiny("data.name=cifar11", name="c11"))
    with pytest.raises(ConfigError, match="model.num_classes=7 does not match dataset 'digits'.*10 classes"):
        fit(tiny("model.num_classes=7", name="k7"))
    with pytest.raises(ConfigError, match="does not use a teacher"):
        fit(tiny("teacher.checkpoint=x", name="t"))


def test_divergence_names_the_step_and_keeps_the_last_checkpoint(tmp_path, tiny):
    cfg = tiny("train.epochs=3",
               "method.name=_nan_at_epoch_2_step_3")
    with pytest.raises(TrainingDiverged, match=r"epoch 2, step 3 .*last good checkpoint \(after epoch 1\)"):
        fit(cfg)
    _, meta = load_tensors(Path(cfg.run_dir) / "checkpoint.safetensors")
    assert meta["epoch"] == 1
    assert all(torch.isfinite(t).all() for t in load_tensors(Path(cfg.run_dir) / "model.safetensors")[0].values())


@pytest.fixture
def empty_yaml(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("{}\n")
    return str(path)


def test_cli_seeds_summary(tmp_path, capsys, empty_yaml, tiny_overrides):
    code = main(["train", "--config", empty_yaml, *tiny_overrides, *RUN, f"run_dir={tmp_path / 's'}",
                 "train.epochs=1", "--seeds", "0,1"])
    assert code == 0
    summary = json.loads((tmp_path / "s" / "seeds.json").read_text())
    assert summary["seeds"] == [0, 1] and len(summary["best_acc"]) == 2
    assert summary["best_acc"][0] != summary["best_acc"][1]  # different seeds, different runs
    assert "2 seeds: best" in capsys.readouterr().out


def test_cli_reports_errors_without_traceback(tmp_path, capsys, empty_yaml):
    assert main(["train", "--config", empty_yaml, "optim.lrr=1"]) == 2
    assert "error: unknown key 'optim.lrr'" in capsys.readouterr().err
    assert main(["distill", "--config", empty_yaml, f"run_dir={tmp_path}/d"]) == 2
    assert "trains without a teacher" in capsys.readouterr().err


def test_every_command_has_help_with_examples():
    from kdcollapse.cli import build_parser

    parser = build_parser()
    actions = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    commands = actions[0].choices
    assert {"train", "distill"} <= set(commands)
    for name, sub in commands.items():
        assert "example" in (sub.epilog or "").lower(), name


@pytest.mark.slow
@pytest.mark.parametrize("per_process", [["data.batch_size=32"], ["data.batch_size=16", "optim.accumulate=2"]],
                         ids=["batch32", "batch16x2"])
def test_torchrun_two_processes_match_one_process_with_double_batch(tmp_path, empty_yaml, tiny_overrides, tiny,
                                                                    per_process):
    """DDP over 2 gloo processes (batch 32 each, or two accumulated batches of 16: DDP then all-reduces only
    at the second) equals one process with batch 64 for a BN-free model. The first through the real torchrun
    launcher, the second on forked ranks in torchrun's environment (tests/ranks.py: no launcher start-up)."""
    from ranks import run_ranks

    common = ["train.epochs=2", "optim.momentum=0.9"]
    args = ["train", "--config", empty_yaml, *tiny_overrides, *RUN, *common, *per_process, f"run_dir={tmp_path / 'ddp'}"]
    if "optim.accumulate=2" in per_process:
        proc = run_ranks(args)
    else:
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "kdcollapse",
               *args]
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # only rank 0 reports: one result line, one line per epoch
    assert proc.stdout.count("best test accuracy") == 1 and "nan" not in proc.stdout, proc.stdout
    assert [line.split()[1] for line in proc.stderr.splitlines() if line.startswith("epoch ")] == ["1/2", "2/2"]
    single = fit(tiny(*common, name="one"))
    a, b = state_of(tmp_path / "ddp"), state_of(single.run_dir)
    for key in a:
        if key.startswith("method."):
            torch.testing.assert_close(a[key], b[key], rtol=1e-4, atol=1e-5, msg=key)
    records = read_metrics(tmp_path / "ddp")
    assert records[-1]["ranks_in_sync"] is True


@pytest.mark.slow
def test_torchrun_run_dir_failure_on_rank_0_stops_every_rank(tmp_path, empty_yaml, tiny_overrides):
    """The main process cannot create the run directory (its parent is a file): both ranks exit with the
    error instead of the other rank waiting at a barrier until the process-group timeout."""
    from ranks import run_ranks

    (tmp_path / "a_file").write_text("")
    proc = run_ranks(["train", "--config", empty_yaml, *tiny_overrides, f"run_dir={tmp_path / 'a_file' / 'run'}"],
                     timeout=120)
    assert proc.returncode != 0
    assert proc.stderr.count("cannot write to run directory") == 1, proc.stderr[-3000:]
    assert "could not prepare the run directory" in proc.stderr, proc.stderr[-3000:]


def test_cli_seeds_into_a_folder_in_use_is_refused_before_any_run(tmp_path, capsys, empty_yaml, tiny_overrides):
    from kdcollapse.runs import RunLock

    (tmp_path / "s").mkdir()
    held = RunLock(tmp_path / "s")  # another --seeds command writing into s/ (and its seeds.json)
    try:
        code = main(["train", "--config", empty_yaml, *tiny_overrides, *RUN, f"run_dir={tmp_path / 's'}",
                     "train.epochs=1", "--seeds", "0,1"])
    finally:
        held.release()
    assert code == 2 and "is in use by another process" in capsys.readouterr().err
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == [".lock"]  # no seed run started, nothing written
    used = tmp_path / "used"  # refused by the check of its seeds' directories: the folder as it was, no lock file
    (used / "seed1").mkdir(parents=True)
    (used / "seed1" / "config.yaml").write_text("seed: 7\n")
    assert main(["train", "--config", empty_yaml, *tiny_overrides, *RUN, f"run_dir={used}", "train.epochs=1",
                 "--seeds", "0,1"]) == 2
    capsys.readouterr()
    assert sorted(p.name for p in used.iterdir()) == ["seed1"]
