"""Optimizers by name, torch schedules, gradient accumulation and the weight average (``train.ema``): each
trains, each resumes bit-identically, and accumulation equals the larger batch."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from kdcollapse.config import load_config
from kdcollapse.errors import ConfigError
from kdcollapse.runs import load_model, load_tensors, read_metrics
from kdcollapse.train import fit, learning_rate
from kdcollapse.train._optim import PaperSchedule, build_schedule

# 200 digits; 4 batches of 50 per epoch (3 of 60 and one of 20 with data.batch_size=60).
COMMON = ("train.epochs=3",)


def checkpoint(run_dir) -> dict[str, torch.Tensor]:
    return load_tensors(Path(run_dir) / "checkpoint.safetensors")[0]


def weights(run_dir, prefix="method.") -> dict[str, torch.Tensor]:
    return {k: v for k, v in checkpoint(run_dir).items() if k.startswith(prefix)}


def stopped_after_epoch_2(cfg, monkeypatch) -> None:
    """Run ``cfg`` (three epochs) and stop it as a kill would, right after epoch 2 is committed."""
    from kdcollapse.train._engine import RunEngine

    commit = RunEngine.commit

    def commit_then_stop(self, epoch, *args):
        commit(self, epoch, *args)
        if epoch == 2:
            raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(RunEngine, "commit", commit_then_stop)
        with pytest.raises(KeyboardInterrupt):
            fit(cfg)


def straight_and_resumed(tiny_config, tmp_path, monkeypatch, *overrides):
    """Three epochs in one go, and three epochs stopped after the second and resumed: their checkpoints."""
    straight = fit(tiny_config(tmp_path / "straight", *COMMON, *overrides))
    stopped_after_epoch_2(tiny_config(tmp_path / "split", *COMMON, *overrides), monkeypatch)
    fit(load_config(tmp_path / "split" / "config.yaml"), resume=True)
    return checkpoint(straight.run_dir), checkpoint(tmp_path / "split")


@pytest.mark.parametrize("overrides", [
    ["optim.name=adamw", "optim.lr=0.01", "optim.kwargs={betas: [0.8, 0.95]}"],
    ["optim.name=RMSprop", "optim.lr=0.001"],
    ["schedule.name=StepLR", "schedule.kwargs={step_size: 1, gamma: 0.5}"],
    ["schedule.name=OneCycleLR", "schedule.interval=step"],
    ["schedule.name=cosine", "schedule.warmup_epochs=0.5", "optim.accumulate=3"],
    ["optim.accumulate=2", "train.ema=0.9"],
], ids=["adamw", "rmsprop", "steplr-epoch", "onecycle-step", "cosine-warmup-accumulate", "accumulate-ema"])
def test_each_option_resumes_bit_identically(tiny_config, tmp_path, monkeypatch, overrides):
    a, b = straight_and_resumed(tiny_config, tmp_path, monkeypatch, *overrides)
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key


def test_adamw_is_the_torch_optimizer_with_the_given_arguments(tiny_config, tmp_path):
    run = fit(tiny_config(tmp_path / "r", "train.epochs=2", "optim.name=adamw", "optim.lr=0.01",
                          "optim.weight_decay=0.05", "optim.kwargs={betas: [0.8, 0.95]}"))
    _, meta = load_tensors(Path(run.run_dir) / "checkpoint.safetensors")
    group = meta["optimizer"]["param_groups"][0]
    assert group["betas"] == [0.8, 0.95] and group["weight_decay"] == 0.05 and "amsgrad" in group
    assert any(k.endswith(".exp_avg_sq") for k in checkpoint(run.run_dir))  # Adam's second moments
    assert run.last_acc > 30  # chance is 10 %


# 200 images: 60 ends an epoch on a step of one batch of 20; 70 on a step of a batch of 35 and one of 25,
# which must weigh 35/60 and 25/60 (not 1/2 each) to equal the whole batch of 60
@pytest.mark.parametrize("batch", [50, 60, 70])
def test_accumulating_two_half_batches_equals_one_whole_batch(tiny_config, tmp_path, batch):
    # The MLP has no batch statistics, so the mean gradient of two halves is the whole batch's gradient.
    whole = fit(tiny_config(tmp_path / "whole", "train.epochs=2", f"data.batch_size={batch}",
                            "schedule.name=cosine", "schedule.warmup_epochs=1"))
    halves = fit(tiny_config(tmp_path / "halves", "train.epochs=2", f"data.batch_size={batch // 2}",
                             "optim.accumulate=2", "schedule.name=cosine", "schedule.warmup_epochs=1"))
    a, b = weights(whole.run_dir), weights(halves.run_dir)
    for key in a:
        torch.testing.assert_close(b[key], a[key], rtol=1e-5, atol=1e-6)
    assert [r["lr"] for r in read_metrics(whole.run_dir)] == [r["lr"] for r in read_metrics(halves.run_dir)]


def test_accumulation_differs_from_one_half_batch_per_step(tiny_config, tmp_path):
    # The control: without accumulation the half batches make twice the steps and end elsewhere.
    whole = fit(tiny_config(tmp_path / "whole", "train.epochs=1", "data.batch_size=50"))
    halves = fit(tiny_config(tmp_path / "halves", "train.epochs=1", "data.batch_size=25"))
    a, b = weights(whole.run_dir), weights(halves.run_dir)
    assert any((a[k] - b[k]).abs().max() > 1e-3 for k in a)


def test_the_papers_schedule_steps_every_optimizer_step_as_learning_rate_says(tiny_config, tmp_path):
    cfg = tiny_config(tmp_path, "schedule.name=cosine", "schedule.warmup_epochs=1", "train.epochs=4")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr)
    schedule = build_schedule(cfg, optimizer, batches=7)
    assert isinstance(schedule, PaperSchedule)
    for step in range(4 * 7):
        epoch, i = divmod(step, 7)
        assert optimizer.param_groups[0]["lr"] == learning_rate(cfg, epoch + i / 7)
        optimizer.step()
        schedule.step()


def test_torch_schedules_get_the_runs_length_and_lr_by_default(tiny_config, tmp_path):
    cfg = tiny_config(tmp_path, "schedule.name=OneCycleLR", "schedule.interval=step", "train.epochs=3")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=cfg.optim.lr, momentum=0.9)
    schedule = build_schedule(cfg, optimizer, batches=5)
    assert schedule.total_steps == 15
    lrs = []
    for _ in range(15):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    assert 0.9 * cfg.optim.lr < max(lrs) <= cfg.optim.lr and lrs[-1] < cfg.optim.lr / 100


def test_the_weight_average_is_what_is_evaluated_and_saved(tiny_config, tmp_path):
    run = fit(tiny_config(tmp_path / "ema", "train.epochs=3", "train.ema=0.5"))
    tensors = checkpoint(run.run_dir)
    model, _ = load_model(Path(run.run_dir) / "model.safetensors")
    saved = model.state_dict()
    for key, value in saved.items():
        assert torch.equal(value, tensors[f"ema.module.{key}"]), key
        assert not torch.equal(value, tensors[f"method.student.{key}"]), key  # the average, not the student
    # 4 optimizer steps per epoch; the first copies the student (AveragedModel counts it too).
    assert tensors["ema.n_averaged"].item() == 12


def test_the_weight_average_follows_the_ema_recursion(tiny_config, tmp_path, monkeypatch):
    # avg_1 = student_1 (the first update copies), then avg_k = decay * avg_{k-1} + (1 - decay) * student_k,
    # for parameters and buffers, after every optimizer step: recomputed here from the students of each step.
    from kdcollapse.train import Trainer

    students = []
    step = Trainer.optimizer_step

    def recording_step(self):
        step(self)
        students.append({k: v.detach().clone().double() for k, v in self.method.student.state_dict().items()})

    monkeypatch.setattr(Trainer, "optimizer_step", recording_step)
    decay = 0.7
    run = fit(tiny_config(tmp_path / "ema", "train.epochs=2", f"train.ema={decay}", "optim.accumulate=2"))
    assert len(students) == 4  # 8 batches of 50 in two epochs, two per optimizer step
    expected = dict(students[0])
    for student in students[1:]:
        expected = {k: decay * expected[k] + (1 - decay) * student[k] for k in expected}
    saved = weights(run.run_dir, "ema.module.")
    for key, value in expected.items():
        torch.testing.assert_close(saved[f"ema.module.{key}"].double(), value, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("overrides, match", [
    (["optim.name=adamm"], r"unknown torch.optim optimizer 'adamm'. Did you mean 'Adam'"),
    (["schedule.name=steplr2"], r"unknown schedule 'steplr2'.*StepLR"),
    (["schedule.name=ReduceLROnPlateau"], r"unknown schedule"),
    (["optim.name=adamw", "optim.momentum=0.5"], r"optim.momentum and optim.nesterov only with optim.name=sgd"),
    (["schedule.name=StepLR", "schedule.warmup_epochs=1"], r"schedule.warmup_epochs = 0 with a torch schedule"),
    (["optim.accumulate=0"], r"optim.accumulate must be >= 1"),
    (["train.ema=1"], r"train.ema must be in \[0, 1\)"),
])
def test_bad_optimizer_and_schedule_settings_are_config_errors(tiny_config, tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        tiny_config(tmp_path, *overrides)


@pytest.mark.parametrize("overrides, match", [
    (["optim.name=adamw", "optim.kwargs={betaz: [0.9, 0.9]}"], r"optim.kwargs: AdamW does not accept.*betas"),
    (["schedule.name=StepLR"], r"schedule.kwargs: StepLR does not accept.*step_size"),
    (["method.name=trades", "method.awp_gamma=0.005", "optim.accumulate=2"], r"optim.accumulate=2: method 'trades'"),
    (["method.name=trades", "method.ema_decay=0.99", "train.ema=0.9"], r"keeps its own weight average"),
])
def test_settings_that_fail_at_construction_fail_before_the_run_dir_changes(tiny_config, tmp_path, overrides, match):
    with pytest.raises(ConfigError, match=match):
        fit(tiny_config(tmp_path / "run", *overrides))
    assert not (tmp_path / "run" / "config.yaml").exists()


def test_dual_head_alignment_refuses_accumulation(tiny_config, tmp_path, digits_teacher):
    with pytest.raises(ConfigError, match="method 'dhkd'.*optim.accumulate=1"):
        fit(tiny_config(tmp_path / "run", "method.name=dhkd", "method.alignment=global",
                        f"teacher.checkpoint={digits_teacher}",
                        "optim.accumulate=2"))


def test_a_run_of_the_previous_checkpoint_format_resumes_its_schedule(tiny_config, tmp_path, monkeypatch):
    # Checkpoints written before schedules were saved have no "schedule" entry; the papers' schedules are
    # a function of the step count, so the resume re-derives it.
    from kdcollapse.runs import _checkpoint as ckpt

    straight = fit(tiny_config(tmp_path / "straight", *COMMON, "schedule.name=cosine"))
    stopped_after_epoch_2(tiny_config(tmp_path / "old", *COMMON, "schedule.name=cosine"), monkeypatch)
    path = tmp_path / "old" / "checkpoint.safetensors"
    tensors, meta = load_tensors(path)
    del meta["schedule"]
    _record_digest(tmp_path / "old", "checkpoint.safetensors", ckpt.save_tensors(path, tensors, meta))
    fit(load_config(tmp_path / "old" / "config.yaml"), resume=True)
    lrs = [r["lr"] for r in read_metrics(tmp_path / "old")]
    assert lrs == [r["lr"] for r in read_metrics(straight.run_dir)]
    assert not math.isclose(lrs[0], lrs[2])


def test_a_schedule_built_for_the_runs_length_refuses_a_longer_resume(tiny_config, tmp_path):
    fit(tiny_config(tmp_path / "run", "train.epochs=2", "schedule.name=OneCycleLR", "schedule.interval=step"))
    with pytest.raises(ConfigError, match=r"OneCycleLR was built for a run of 8 steps.*train.epochs=2"):
        fit(load_config(tmp_path / "run" / "config.yaml", ["train.epochs=3"]), resume=True)
    assert len(read_metrics(tmp_path / "run")) == 2


def _record_digest(run_dir: Path, name: str, digest: str) -> None:
    """Record a rewritten file's digest in the commit marker, as the older version would have left it."""
    import json

    state = json.loads((run_dir / "state.json").read_text())
    state["files"][name]["sha256"] = digest
    (run_dir / "state.json").write_text(json.dumps(state))
