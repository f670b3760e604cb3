"""User code in the CLI: ``--import MODULE`` and the ``imports:`` config key see user registrations."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from kdcollapse.cli import main, split_imports
from kdcollapse.data._dataset import _DATASETS
from kdcollapse.errors import KdcollapseError
from kdcollapse.methods import _METHODS
from kdcollapse.models import _MODELS
from kdcollapse.runs import load_model

USER_MODULE = '''
"""What a user writes: plain torch modules and a dataset, registered with kdcollapse."""
import torch
import torch.nn.functional as F
from torch import nn

from kdcollapse.data import TensorDataset, register_dataset
from kdcollapse.models import register_model


class TwoLayerCNN(nn.Module):
    def __init__(self, num_classes, in_channels):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(in_channels, 4, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(4, 6, 3, padding=1), nn.ReLU())
        self.fc = nn.Linear(6, num_classes)

    def forward(self, x):
        return self.fc(self.body(x).mean((2, 3)))


class TimmStyle(nn.Module):
    def __init__(self, num_classes, in_channels):
        super().__init__()
        self.stem = nn.Conv2d(in_channels, 5, 3, padding=1)
        self.head = nn.Linear(5, num_classes)

    def forward_features(self, x):
        return F.relu(self.stem(x))

    def forward_head(self, x, pre_logits=False):
        x = x.mean((2, 3))
        return x if pre_logits else self.head(x)

    def forward(self, x):
        return self.forward_head(self.forward_features(x))


@register_model("user_cnn")
def user_cnn(num_classes, in_channels=3):
    return TwoLayerCNN(num_classes, in_channels)


@register_model("user_timm")
def user_timm(num_classes, in_channels=3):
    return TimmStyle(num_classes, in_channels)


@register_dataset("user_stripes", description="3 classes of 8x8 grey stripes")
def user_stripes(root, split, n_per_class=12):
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    labels = torch.arange(3).repeat_interleave(n_per_class)
    images = torch.rand(len(labels), 1, 8, 8, generator=g) * 80
    for k in range(3):
        images[labels == k, :, :, 2 * k:2 * k + 2] += 170  # class k: a bright column pair
    return TensorDataset(images.to(torch.uint8), labels, ["left", "middle", "right"], (0.3,), (0.3,),
                         "user_stripes")
'''

QUICK = ["train.epochs=1", "train.progress=false", "data.batch_size=12", "schedule.name=constant",
         "data.name=user_stripes", "train.device=cpu"]


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    """A module ``mymodels_<n>`` on sys.path; the registries are restored afterwards."""
    name = f"mymodels_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(textwrap.dedent(USER_MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    for registry in (_MODELS, _DATASETS, _METHODS):
        monkeypatch.setattr(registry, "_entries", dict(registry._entries))
    yield name
    sys.modules.pop(name, None)


@pytest.fixture
def config(tmp_path):
    path = tmp_path / "empty.yaml"
    path.write_text("{}\n")
    return str(path)


def test_split_imports_before_and_after_the_command():
    assert split_imports(["--import", "a", "train", "--import=b.c", "x=1"]) == (["a", "b.c"], ["train", "x=1"])
    with pytest.raises(KdcollapseError, match="needs a module name"):
        split_imports(["train", "--import"])


def test_train_and_distill_plain_modules_through_the_cli(tmp_path, user_module, config):
    teacher = tmp_path / "teacher"
    assert main(["--import", user_module, "train", "--config", config, *QUICK, "model.name=user_cnn",
                 f"run_dir={teacher}"]) == 0
    saved = yaml.safe_load((teacher / "config.yaml").read_text())
    assert saved["imports"] == [user_module]  # a later analyze/resume imports it again
    model, meta = load_model(teacher)
    assert meta["model"] == "user_cnn" and type(model.module).__name__ == "TwoLayerCNN"
    # --import after the command; a timm-style student distilled from the plain-CNN teacher
    student = tmp_path / "student"
    assert main(["distill", "--config", config, f"--import={user_module}", *QUICK, "model.name=user_timm",
                 "method.name=kd", f"teacher.checkpoint={teacher}", f"run_dir={student}"]) == 0
    assert load_model(student)[1]["model"] == "user_timm"


def test_imports_config_key(tmp_path, user_module):
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump({"imports": [user_module], "model": {"name": "user_cnn"}}))
    assert main(["train", "--config", str(path), *QUICK, f"run_dir={tmp_path / 'r'}"]) == 0
    assert (tmp_path / "r" / "model.safetensors").is_file()


def test_a_missing_module_is_one_clear_error(capsys, config):
    assert main(["--import", "no_such_module_xyz", "models"]) == 2
    assert "--import: cannot import module 'no_such_module_xyz'" in capsys.readouterr().err
    assert main(["train", "--config", config, "imports=[no_such_module_xyz]"]) == 2
    assert "imports: cannot import module 'no_such_module_xyz'" in capsys.readouterr().err


def test_python_m_kdcollapse_sees_the_registrations(tmp_path, user_module):
    """What every torchrun rank runs: ``python -m kdcollapse`` with the same arguments."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run([sys.executable, "-m", "kdcollapse", "models", "list", "user_*", "--import", user_module,
                          "--classes", "3", "--in-channels", "1"], capture_output=True, text=True, env=env,
                         cwd=Path(tmp_path), timeout=120)
    assert out.returncode == 0, out.stderr
    assert "user_cnn" in out.stdout and "user_timm" in out.stdout
