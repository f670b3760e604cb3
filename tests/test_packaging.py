"""Checkpoints with tied weights, file modes, shipped recipes, optional dependencies and the wheel."""

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from kdcollapse.cli import main
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.recipes import config_file, list_recipes, recipe_path
from kdcollapse.runs import load_tensors, save_tensors
from kdcollapse.runs._checkpoint import load_state

ROOT = Path(__file__).resolve().parents[1]


class TiedLM(nn.Module):
    """A language-model-like module whose output layer shares its weight with the embedding."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(11, 4)
        self.head = nn.Linear(4, 11, bias=False)
        self.head.weight = self.embed.weight


def test_tied_weights_are_saved_once_and_restored_tied(tmp_path):
    torch.manual_seed(0)
    model = TiedLM()
    state = model.state_dict()
    state["slice"] = model.embed.weight[:2]  # overlaps the embedding differently: copied
    save_tensors(tmp_path / "m.safetensors", state, {"a": 1})
    tensors, meta = load_tensors(tmp_path / "m.safetensors")
    assert meta == {"a": 1} and tensors["head.weight"] is tensors["embed.weight"]
    torch.testing.assert_close(tensors["slice"], model.embed.weight[:2].detach())
    fresh = TiedLM()
    load_state(fresh, {k: v for k, v in tensors.items() if k != "slice"}, "m")
    assert fresh.head.weight is fresh.embed.weight and torch.equal(fresh.embed.weight, model.embed.weight)


def test_files_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        save_tensors(tmp_path / "a.safetensors", {"x": torch.zeros(2)}, {})
        os.umask(0o077)
        save_tensors(tmp_path / "b.safetensors", {"x": torch.zeros(2)}, {})
    finally:
        os.umask(old)
    assert (tmp_path / "a.safetensors").stat().st_mode & 0o777 == 0o644
    assert (tmp_path / "b.safetensors").stat().st_mode & 0o777 == 0o600


def test_recipes_are_the_repository_configs():
    names = list_recipes()
    assert len(names) == len(list((ROOT / "configs").rglob("*.yaml")))
    assert recipe_path("cifar100/kd/resnet32x4_resnet8x4").read_text() == \
        (ROOT / "configs/cifar100/kd/resnet32x4_resnet8x4.yaml").read_text()
    assert recipe_path("configs/fashion_mnist/kd.yaml") == recipe_path("fashion_mnist/kd")
    with pytest.raises(ConfigError, match="Did you mean 'fashion_mnist/kd'"):
        config_file("fashion_mnist/kdd")


def test_recipes_cli_and_config_by_name(tmp_path, capsys):
    assert main(["recipes", "list", "fashion_mnist/*"]) == 0
    assert "fashion_mnist/teacher" in capsys.readouterr().out.split()
    assert main(["recipes", "show", "fashion_mnist/kd"]) == 0
    assert "method:" in capsys.readouterr().out
    assert main(["train", "--config", "fashion_mnist/nope"]) == 2
    assert "no config file or recipe 'fashion_mnist/nope'" in capsys.readouterr().err


def test_a_missing_optional_dependency_names_the_extra(monkeypatch):
    from kdcollapse._optional import OptionalModule, require

    monkeypatch.setitem(sys.modules, "sklearn.manifold", None)  # importing it now raises ImportError
    with pytest.raises(KdcollapseError, match=r"t-SNE needs scikit-learn.*pip install 'kdcollapse\[analysis\]'"):
        require("sklearn.manifold", "t-SNE")
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    with pytest.raises(KdcollapseError, match=r"plotting needs matplotlib"):
        OptionalModule("matplotlib.pyplot", "plotting").subplots  # noqa: B018


def test_the_package_imports_matplotlib_and_sklearn_only_on_use():
    """(torchmetrics imports matplotlib itself when it is installed, so check our own references.)"""
    code = ("import kdcollapse.train, kdcollapse.analysis, kdcollapse.experiments, kdcollapse.cli, kdcollapse.data\n"
            "from kdcollapse._optional import pyplot, ticker\n"
            "import sys; assert pyplot._module is None and ticker._module is None\n"
            "assert not any(m == 'sklearn' or m.startswith('sklearn.') for m in sys.modules), 'sklearn imported'\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.mark.slow
def test_wheel_installs_and_ships_the_recipes(tmp_path):
    """A wheel built from the tree, installed into a fresh venv outside the repository (reusing this
    environment's torch through a .pth file), runs `kdcollapse recipes list` and `recipes show`."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(ROOT)], check=True, timeout=300, cwd=tmp_path)
    (wheel,) = wheels.glob("kdcollapse-*.whl")
    with zipfile.ZipFile(wheel) as z:
        files = z.namelist()
    assert "kdcollapse/configs/cifar100/kd/resnet32x4_resnet8x4.yaml" in files
    assert any(f.endswith("licenses/LICENSE") for f in files)
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed copy, not this tree
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    # torch and the other dependencies from this environment (which may itself be a venv)
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=env).stdout.strip()
    Path(site, "host_packages.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "-q", str(wheel)],
                   check=True, timeout=300, env=env, cwd=tmp_path)
    kdcollapse = venv / "bin" / "kdcollapse"
    listed = subprocess.run([str(kdcollapse), "recipes", "list"], capture_output=True, text=True, env=env,
                            cwd=tmp_path, timeout=120)
    assert listed.returncode == 0, listed.stderr
    assert "cifar100/dhkd/resnet32x4_resnet8x4" in listed.stdout.split()
    shown = subprocess.run([str(kdcollapse), "recipes", "show", "fashion_mnist/teacher"], capture_output=True,
                           text=True, env=env, cwd=tmp_path, timeout=120)
    assert shown.returncode == 0 and str(venv) in shown.stdout and "model:" in shown.stdout
    shutil.rmtree(venv)
