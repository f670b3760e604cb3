"""Packages use each other through their faces (``kdcollapse.<package>``, its ``__init__``), never through
another package's private modules (``kdcollapse.<package>._<module>``) or private names; checked on the
source, function-level imports included (the import-linter layers of tests/test_layers.py do not see this)."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "kdcollapse"


def _package(path: Path) -> str:
    """The top-level part of ``kdcollapse`` a source file belongs to (``"train"``, or ``"config"`` for
    ``config.py``)."""
    return path.relative_to(SRC).parts[0].removesuffix(".py")


def private_imports(path: Path) -> list[str]:
    """The imports in ``path`` of another package's private module or private name."""
    own, found = _package(path), []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[0] != "kdcollapse" or len(parts) < 3 or parts[1] == own:
                continue
            if any(p.startswith("_") and not p.startswith("__") for p in parts[2:]):
                found.append(f"{path.relative_to(SRC.parent)}:{node.lineno}: {target}")
                break
    return found


def test_no_package_imports_another_packages_private_module():
    found = [line for path in sorted(SRC.rglob("*.py")) for line in private_imports(path)]
    assert not found, "use the package's face (its __init__) instead:\n" + "\n".join(found)


def test_the_check_catches_a_private_import(tmp_path, monkeypatch):
    bad = SRC / "train" / "_probe_private_import.py"  # checked, never written: parse a string instead
    source = "from kdcollapse.runs._checkpoint import load_state\nfrom kdcollapse.train._optim import x\n"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: source)
    assert private_imports(bad) == ["kdcollapse/train/_probe_private_import.py:1: kdcollapse.runs._checkpoint"]


EXTENSION_HELPERS = {
    "kdcollapse.methods": ["Distiller", "StageTransfer", "check_config", "check_stages", "check_pairs",
                           "softmax_request", "standardized", "warmup_factor", "stages", "register_method", "Equality"],
    "kdcollapse.models": ["register_model", "model_info", "ModelInfo", "ConvClassifier", "conv_bn"],
    "kdcollapse.losses": ["register_loss", "get_loss", "example_tensors", "class_table"],
}


def test_the_extension_helpers_are_on_the_faces_with_docstrings():
    """What an ``--import`` method, model or loss needs is importable from the package's face, documented."""
    import importlib
    import inspect

    for package, names in EXTENSION_HELPERS.items():
        face = importlib.import_module(package)
        for name in names:
            assert name in face.__all__, f"{package}.{name} is not on the face"
            assert inspect.getdoc(getattr(face, name)), f"{package}.{name} has no docstring"
