"""The package's layering (pyproject.toml, [tool.importlinter]) holds: no module imports from a layer above
its own, function-level imports included, so there is no import cycle between top-level parts
(docs/ARCHITECTURE.md)."""

import logging
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def loggers_stay_enabled():
    """import-linter configures logging with ``dictConfig``, which disables every logger that exists: the
    library's own (``kdcollapse.train``) would be silent in every test after these."""
    loggers = [lg for lg in logging.Logger.manager.loggerDict.values() if isinstance(lg, logging.Logger)]
    before = [lg.disabled for lg in loggers]
    yield
    for lg, disabled in zip(loggers, before):
        lg.disabled = disabled


def test_import_layers_contract_is_kept(capsys):
    pytest.importorskip("importlinter", reason="import-linter is a dev dependency (pip install -e '.[dev]')")
    from importlinter.cli import lint_imports

    status = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert status == 0, capsys.readouterr().out


@pytest.mark.parametrize("module, line, chain", [
    ("metrics/_upward.py", "from kdcollapse.train import fit  # noqa: F401\n", "kdcollapse.metrics._upward -> kdcollapse.train"),
    # inside a package: one run's state importing the page would be the cycle study/ used to hide
    ("study/_runs.py", "from kdcollapse.study._page import write_page  # noqa: F401,E402\n",
     "kdcollapse.study._runs -> kdcollapse.study._page"),
])
def test_the_contract_catches_an_upward_import(tmp_path, monkeypatch, capsys, module, line, chain):
    """The check can fail: a copy of the package in which a metric imports the trainer, or a study's run state
    imports its page, breaks the contract."""
    pytest.importorskip("importlinter")
    import shutil
    import sys

    from importlinter.cli import lint_imports

    copy = tmp_path / "src"
    shutil.copytree(ROOT / "src" / "kdcollapse", copy / "kdcollapse", ignore=shutil.ignore_patterns("__pycache__"))
    bad = copy / "kdcollapse" / module
    bad.write_text((bad.read_text() if bad.is_file() else "") + line)
    monkeypatch.syspath_prepend(str(copy))
    for name in [m for m in sys.modules if m == "kdcollapse" or m.startswith("kdcollapse.")]:
        monkeypatch.delitem(sys.modules, name)
    status = lint_imports(config_filename=str(ROOT / "pyproject.toml"), no_cache=True, no_logo=True)
    assert status != 0
    assert chain in capsys.readouterr().out


# docs/ARCHITECTURE.md, "Layers": no module over this many lines, in the package (its configs/ link followed:
# the recipe generator's tables live there) and in benchmarks/.
MAX_LINES = 500


def long_modules(*roots: Path) -> dict[str, int]:
    """``{path: lines}`` of every ``.py`` under ``roots`` (symbolic links to folders followed) over MAX_LINES."""
    import os

    found = {}
    for root in roots:
        for folder, dirs, files in os.walk(root, followlinks=True):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for name in files:
                if name.endswith(".py"):
                    path = Path(folder, name)
                    found[str(path.relative_to(root.parent))] = len(path.read_text(encoding="utf-8").splitlines())
    return {path: lines for path, lines in found.items() if lines > MAX_LINES}


def test_no_module_is_over_500_lines():
    assert (ROOT / "src" / "kdcollapse" / "configs").is_symlink()  # the walk below goes through it
    assert long_modules(ROOT / "src", ROOT / "benchmarks") == {}, "split it by concern (docs/ARCHITECTURE.md)"


def test_the_line_rule_sees_a_long_module_behind_a_folder_link(tmp_path):
    """The check can fail: a 501-line module in a folder reached through a link (as configs/ is) is reported,
    a 500-line one is not."""
    (tmp_path / "real").mkdir()
    (tmp_path / "real" / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "real" / "fits.py").write_text("x = 1\n" * MAX_LINES)
    (tmp_path / "src" / "pkg").mkdir(parents=True)
    (tmp_path / "src" / "pkg" / "configs").symlink_to(tmp_path / "real", target_is_directory=True)
    assert long_modules(tmp_path / "src") == {str(Path("src", "pkg", "configs", "long.py")): MAX_LINES + 1}
