"""The command line starts without dead weight: building the parser and printing any ``--help`` loads
neither plotting nor metric libraries (issue 15; benchmarks/bench_cli.py measures the start-up time)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("matplotlib", "torchmetrics", "scipy", "sklearn")
COMMANDS = ("", "demo", "train", "distill", "data", "models", "geometry", "analyze", "plot", "robust-eval")

# One interpreter prints every command's help (stdout captured), then lists the heavy packages it loaded.
_PROBE = """
import contextlib, io, sys
from kdcollapse.cli import main
helps = 0
for command in {commands!r}:
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        main([command, "--help"] if command else ["--help"])
    helps += text.getvalue().startswith("usage: kdcollapse")
print("HELPS", helps, "LOADED", *sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))
"""


def _probe(prelude: str = "") -> tuple[int, list[str]]:
    code = prelude + _PROBE.format(commands=COMMANDS, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    helps, loaded = out.rsplit("HELPS", 1)[1].split("LOADED")
    return int(helps), loaded.split()


def test_help_loads_no_heavy_library():
    helps, loaded = _probe()
    assert helps == len(COMMANDS)  # every help was printed, so the probe exercised the real commands
    assert loaded == [], f"`kdcollapse COMMAND --help` imported {loaded}"


def test_the_probe_sees_a_heavy_import():
    """The check can fail: once the analysis report is imported, torchmetrics and matplotlib are loaded."""
    helps, loaded = _probe("import kdcollapse.analysis._analyze\n")
    assert helps == len(COMMANDS) and {"matplotlib", "torchmetrics"} <= set(loaded)


def test_lazy_analysis_package_exports_every_name():
    import kdcollapse.analysis as analysis
    from kdcollapse.analysis._analyze import analyze

    assert analysis.analyze is analyze
    assert all(getattr(analysis, name) is not None for name in analysis.__all__)
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        analysis.nope  # noqa: B018


def test_robust_eval_help_shows_what_the_library_offers():
    """The robust-eval parser states its choices without importing the attacks; they must be the library's."""
    from kdcollapse.adversarial import NORMS, list_attacks
    from kdcollapse.adversarial._registry import STANDARD_BUDGET
    from kdcollapse.cli import robust_eval as cli
    from kdcollapse.experiments import robust_eval

    assert tuple(NORMS) == cli.NORMS and tuple(list_attacks()) == cli.ATTACKS
    assert cli.DEFAULT_ATTACKS == robust_eval.DEFAULT_ATTACKS and cli.WEIGHTS == tuple(robust_eval.WEIGHTS)
    assert cli.STANDARD_BUDGET == STANDARD_BUDGET


def test_a_reader_that_leaves_early_gets_no_traceback():
    """`kdcollapse recipes list | head`: a closed pipe ends the command quietly (status 1, nothing on stderr).
    The reading end is closed before the command starts, so the write fails every time."""
    code = "import sys; from kdcollapse.cli import main; sys.exit(main(['recipes', 'list']))"
    src = str(Path(__file__).parents[1] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([src, os.environ.get("PYTHONPATH", "")])}
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-c", code], stdout=write_end, stderr=subprocess.PIPE, env=env,
                              text=True)
    finally:
        os.close(write_end)
    assert proc.returncode == 1 and proc.stderr == "", proc.stderr
