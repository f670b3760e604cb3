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


# Run inside the fresh venv by the test below: every command's --help, a tiny train / distill / analyze, and
# `plot`, which needs an extra, refused before it reads anything.
CORE_SCRIPT = """
import argparse, contextlib, importlib.util, io, json, sys
from pathlib import Path
for extra in ("matplotlib", "sklearn", "tensorboard", "transformers"):
    assert importlib.util.find_spec(extra) is None, extra + " is visible: not a core install"
import kdcollapse
assert "site-packages" in kdcollapse.__file__, kdcollapse.__file__
from kdcollapse.cli import build_parser, main

def parsers(parser, path=()):
    yield path
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from parsers(sub, (*path, name))

helped = []
for path in parsers(build_parser()):
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        try:
            main([*path, "--help"])
        except SystemExit as exit:
            assert exit.code == 0, (path, exit.code)
    assert "usage: kdcollapse" in out.getvalue(), path
    helped.append(" ".join(path))
Path("c.yaml").write_text("data: {name: gaussian_mixture, train_per_class: 20, test_per_class: 10}\\n"
                          "model: {name: mlp, kwargs: {input_size: 1, hidden: [16]}}\\n"
                          "train: {epochs: 1, progress: false}\\n")
assert main(["train", "--config", "c.yaml", "run_dir=t", "--quiet"]) == 0
assert main(["train", "--config", "c.yaml", "run_dir=s", "method.name=kd", "teacher.checkpoint=t", "--quiet"]) == 0
assert main(["analyze", "s", "--no-progress"]) == 0
report = json.loads(Path("s/analysis_test/analysis.json").read_text())
assert report["figures"] == {} and report["num_samples"] == 100
assert main(["plot", "s", "--out", "c.png"]) == 2 and not Path("c.png").exists()
print("HELPED", len(helped), ";".join(helped))
"""


def _core_closure(requirements: list[str]) -> dict:
    """The installed distributions that the unconditional ``requirements`` need, recursively."""
    from importlib import metadata

    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    found, todo = {}, [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        if req.marker is not None and not req.marker.evaluate({"extra": ""}):
            continue
        if canonicalize_name(req.name) not in found:
            dist = metadata.distribution(req.name)
            found[canonicalize_name(req.name)] = dist
            todo += [Requirement(r) for r in dist.requires or []]
    return found


@pytest.mark.slow
def test_a_core_install_runs_every_command(tmp_path):
    """Issue 28: `pip install kdcollapse` without extras runs every command. The wheel built from the tree goes
    into a fresh venv that sees exactly its core dependencies: this environment's copies of them (torch
    2.13.0 among them, reused rather than downloaded again), linked one by one into a folder the venv reads
    through a .pth file; `pip check` confirms the wheel's requirements are met, and matplotlib, scikit-learn,
    TensorBoard and transformers are invisible. It then runs every command's --help, a tiny train, distill
    and analyze, `plot` (refused: it needs the analysis extra), and the installed `kdcollapse` script
    importing a module from the current directory and showing a shipped recipe."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                    str(wheels), str(ROOT)], check=True, timeout=300, cwd=tmp_path)
    (wheel,) = wheels.glob("kdcollapse-*.whl")
    with zipfile.ZipFile(wheel) as z:
        files = z.namelist()
        metadata_file = next(f for f in files if f.endswith(".dist-info/METADATA"))
        requires = [line.removeprefix("Requires-Dist: ") for line in z.read(metadata_file).decode().splitlines()
                    if line.startswith("Requires-Dist: ") and "extra ==" not in line]
    assert "kdcollapse/configs/cifar100/kd/resnet32x4_resnet8x4.yaml" in files
    assert any(f.endswith("licenses/LICENSE") for f in files)
    assert any(r.startswith("pillow") for r in requires) and not any(r.startswith("matplotlib") for r in requires)
    core = tmp_path / "core"
    core.mkdir()
    for dist in _core_closure(requires).values():
        for top in {Path(f).parts[0] for f in dist.files or () if not str(f).startswith("..")}:
            if not (core / top).exists() and dist.locate_file(top).exists():
                (core / top).symlink_to(dist.locate_file(top))
    venv = tmp_path / "venv"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the installed copy, not this tree
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    python = venv / "bin" / "python"
    site = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                          capture_output=True, text=True, check=True, env=env).stdout.strip()
    Path(site, "core_dependencies.pth").write_text(f"{core}\n")
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    subprocess.run([*pip, "install", "--no-deps", "--no-index", "-q", str(wheel)], check=True, timeout=300, env=env,
                   cwd=tmp_path)
    checked = subprocess.run([*pip, "check"], capture_output=True, text=True, env=env, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    work = tmp_path / "work"
    work.mkdir()
    ran = subprocess.run([str(python), "-c", CORE_SCRIPT], capture_output=True, text=True, env=env, cwd=work,
                         timeout=600)
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-4000:]
    helped = ran.stdout.split("HELPED ")[1].split(" ", 1)
    assert int(helped[0]) >= 15 and "train" in helped[1] and "geometry tammes" in helped[1]
    assert "needs matplotlib" in ran.stderr and "pip install 'kdcollapse[analysis]'" in ran.stderr
    (work / "first_hour_mods.py").write_text("from kdcollapse.models import register_model\n")
    shown = subprocess.run([str(venv / "bin" / "kdcollapse"), "--import", "first_hour_mods", "recipes", "show",
                            "fashion_mnist/teacher"], capture_output=True, text=True, env=env, cwd=work, timeout=120)
    assert shown.returncode == 0, shown.stderr
    assert str(venv) in shown.stdout and "model:" in shown.stdout
    shutil.rmtree(venv)
