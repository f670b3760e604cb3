"""Shared harness of the lockstep tests (tests/test_lockstep_*.py): kdcollapse's ``Trainer`` and an official
training loop from the same weights on the same batches, compared after every step.

``run_trainer`` trains a tiny run on a CIFAR-100 release in the official pickle format written by the test
(noise images, no augmentation), with ``Trainer`` itself — its ``train`` → ``train_epoch`` → ``step`` loop,
schedule, optimizer and method — and records, for every optimizer step, the batch it saw, the learning rate
it used, the method's logged loss parts and the parameters and buffers afterwards. Everything runs in
float64: the run's models are built under a float64 default dtype and the loader's float32 batches are cast
as the loader finishes them (``Loader._finish``). The teacher's outputs pass through ``FrozenTeacher.read``, which returns float32
(every method receives them so); the official loop is given the same float32-rounded teacher outputs (see
``OfficialTeacher``), so both sides see identical inputs and the comparison is of float64 arithmetic.

The official loops (transcribed inside each test file, citing repository, commit and file) receive a deep
copy of the student as it was before the first step, wrapped in ``OfficialStudent``: the ``(logits, feats)``
interface of mdistiller's and RepDistiller's models, built from the model's ``forward_intermediates`` seam.
"""

from __future__ import annotations

import contextlib
import copy
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import save_file
from torch import nn

from formats import cifar_members, py2_pickle
from kdcollapse.config import load_config
from kdcollapse.data._loader import Loader
from kdcollapse.methods import TeacherRequest
from kdcollapse.models import create_model
from kdcollapse.train._trainer import Trainer


def write_cifar100(root: Path, per_batch: int = 10, labels: int = 100) -> Path:
    """A CIFAR-100 release (python pickle format, official names and keys) of 5 * per_batch noise images, the
    i-th of class i % ``labels``."""
    files, members = cifar_members(True, per_batch=per_batch)
    train = members["train"] | {"fine_labels": [i % labels for i in range(5 * per_batch)]}
    files["train"] = py2_pickle(train)
    (root / "cifar-100-python").mkdir(parents=True)
    for name, data in files.items():
        (root / "cifar-100-python" / name).write_bytes(data)
    return root


def write_teacher(path: Path, model: str, seed: int = 1, num_classes: int = 100) -> Path:
    """A teacher's weights file: ``model`` (3x32x32 inputs) from ``seed``, BN statistics made non-trivial."""
    torch.manual_seed(seed)
    net = create_model(model, num_classes, in_channels=3)
    for m in net.modules():
        if isinstance(m, nn.BatchNorm2d):
            m.running_mean.normal_(0, 0.1)
            m.running_var.uniform_(0.5, 1.5)
    save_file({k: v.contiguous() for k, v in net.state_dict().items()}, str(path))
    return path


@dataclass
class Trajectory:
    initial: nn.Module  # the method (student and any trainable parts) before the first step
    batches: list = field(default_factory=list)  # (x float64, y, epoch 0-based)
    lrs: list = field(default_factory=list)
    parts: list = field(default_factory=list)  # {name: float}
    indices: list = field(default_factory=list)  # the batch's dataset indices (methods that declare needs_index)
    states: list = field(default_factory=list)  # {name: tensor} of the method's parameters and buffers
    trainer: Trainer | None = None


@contextlib.contextmanager
def float64():
    """Tensors and modules created inside are float64 (the official side's modules too)."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


@contextlib.contextmanager
def float64_run(monkeypatch):
    """Models built in float64 and every batch cast to float64 before the model sees it."""
    finish = Loader._finish
    monkeypatch.setattr(Loader, "_finish", lambda self, *args: finish(self, *args).double())
    with float64():
        yield


# The logit methods' student: an MLP on the 3x32x32 images (cheap in float64); the feature methods use resnet8.
MLP_STUDENT = ["model.name=mlp", "model.kwargs={input_size: 32, hidden: [32]}"]


def run_trainer(tmp_path: Path, monkeypatch, overrides: list[str], *, teacher: str | None, per_batch: int = 10,
                batch_size: int = 16, classes: int | None = None, prepare=None) -> Trajectory:
    """``Trainer`` on 5 * ``per_batch`` images in batches of ``batch_size`` (the last one shorter); ``overrides``
    name the student (``model.*``), the method and the schedule. ``classes``: keep only the first ``classes``
    classes (``data.classes``), each seen in every batch sequence. ``prepare(trainer)`` runs before training."""
    data = write_cifar100(tmp_path / "data", per_batch, classes or 100)
    args = ["data.name=cifar100", f"data.root={data}", "data.crop_padding=0", "data.flip=false",
            f"data.batch_size={batch_size}", "data.num_workers=0", "train.channels_last=false",
            "train.progress=false", "train.eval_every=1000", "seed=3", f"run_dir={tmp_path / 'run'}", *overrides]
    if classes is not None:
        args.append(f"data.classes=[{', '.join(map(str, range(classes)))}]")
    if teacher is not None:
        weights = write_teacher(tmp_path / "teacher.safetensors", teacher, num_classes=classes or 100)
        args += [f"teacher.model={teacher}", f"teacher.weights={weights}"]
    cfg = load_config(None, args)
    with float64_run(monkeypatch):
        trainer = Trainer(cfg)
        trajectory = Trajectory(initial=copy.deepcopy(_without_teacher(trainer.method)), trainer=trainer)
        step = trainer.step

        def recorded(x, y, batch=0, batches=1, index=None):
            lr = trainer.optimizer.param_groups[0]["lr"]
            out = step(x, y, batch, batches, index)
            trajectory.batches.append((x.detach().clone(), y.clone(), trainer.method.epoch))
            trajectory.lrs.append(lr)
            trajectory.indices.append(index)
            trajectory.parts.append({k: float(v.detach()) for k, v in out.items() if k != "logits" and v.dim() == 0})
            trajectory.states.append({k: v.detach().clone() for k, v in trainer.method.state_dict().items()})
            return out

        trainer.step = recorded
        if prepare is not None:
            prepare(trainer)
        trainer.run()
    return trajectory


def _without_teacher(method):
    return method  # FrozenTeacher is no module: a deep copy of the method does not copy it into the graph


class OfficialStudent(nn.Module):
    """A kdcollapse model as the official repositories' models: ``forward(x) -> (logits, feats)`` with
    ``feats["feats"]`` (stage outputs, stem first), ``feats["preact_feats"]`` and ``feats["pooled_feat"]``."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x):
        stages = list(range(len(self.model.feature_info)))
        h, maps = self.model.forward_intermediates(x, stages) if stages else (self.model.forward_features(x), [])
        return self.model.forward_head(h), {"feats": maps, "pooled_feat": h}


class OfficialTeacher(nn.Module):
    """The run's teacher for the official code: its outputs exactly as ``FrozenTeacher.read`` gives them to
    kdcollapse's methods (float32, here widened back to float64), with the same ``(logits, feats)`` shape."""

    def __init__(self, teacher):
        super().__init__()
        self.teacher, self.stages = teacher, tuple(range(len(teacher.feature_info)))  # every stage, stem first

    def forward(self, x):
        out = self.teacher.read(x, TeacherRequest(features=True, stages=self.stages))
        pre = self.teacher.read(x, TeacherRequest(stages=self.stages, pre_act=True)).maps
        return out.logits.double(), {"feats": [m.double() for m in out.maps], "pooled_feat": out.features.double(),
                                     "preact_feats": [m.double() for m in pre]}


def assert_lockstep(trajectory: Trajectory, official_lrs, official_parts, official_states, names: dict[str, str],
                    state_map=lambda name: name, rtol: float = 1e-10, atol: float = 1e-12,
                    trajectory_steps: int | None = None) -> None:
    """Every step's learning rate, logged loss parts (``names``: ours -> official) and parameters/buffers
    (``state_map``: our state-dict name -> the official one) equal; ``trajectory_steps``: only the first steps."""
    if trajectory_steps is not None:
        trajectory = Trajectory(trajectory.initial, trajectory.batches[:trajectory_steps],
                                trajectory.lrs[:trajectory_steps], trajectory.parts[:trajectory_steps],
                                trajectory.states[:trajectory_steps])
    assert len(official_lrs) == len(trajectory.lrs) > 0
    np.testing.assert_allclose(trajectory.lrs, official_lrs, rtol=1e-15)
    for step, (ours, theirs) in enumerate(zip(trajectory.parts, official_parts)):
        for mine, other in names.items():
            np.testing.assert_allclose(ours[mine], theirs[other], rtol=rtol, atol=atol, err_msg=f"step {step}: {mine}")
    for step, (ours, theirs) in enumerate(zip(trajectory.states, official_states)):
        for name, value in ours.items():
            other = state_map(name)
            if other is None:
                continue
            torch.testing.assert_close(value, theirs[other], rtol=rtol, atol=atol,
                                       msg=lambda m, step=step, name=name: f"step {step}, {name}: {m}")
