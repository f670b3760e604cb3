"""The command line starts without dead weight: building the parser and printing any ``--help`` loads
neither plotting nor metric libraries (issue 15; benchmarks/bench_cli.py measures the start-up time), and
importing the library loads none of them either (issue 42; benchmarks/bench_import.py measures it)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

HEAVY = ("matplotlib", "torchmetrics", "scipy", "sklearn", "transformers", "PIL")
COMMANDS = ("", "demo", "train", "distill", "data", "models", "geometry", "analyze", "plot", "robust-eval")

# One interpreter prints every command's help (stdout captured) and lists the heavy packages it loaded; then
# imports the package's modules (nothing heavy yet: plotting and t-SNE load on use) and lists them again;
# then imports the analysis report, which loads them, and lists them a last time (so the check can fail).
_PROBE = """
import contextlib, io, sys
from kdcollapse.cli import main
def loaded():
    return " ".join(sorted({{m.split('.')[0] for m in sys.modules}} & set({heavy!r})))
helps = 0
for command in {commands!r}:
    text = io.StringIO()
    with contextlib.redirect_stdout(text), contextlib.suppress(SystemExit):
        main([command, "--help"] if command else ["--help"])
    helps += text.getvalue().startswith("usage: kdcollapse")
print("HELPS", helps, "|", loaded())
import kdcollapse.train, kdcollapse.analysis, kdcollapse.experiments, kdcollapse.cli, kdcollapse.data
from kdcollapse._optional import pyplot, ticker
print("PACKAGE", pyplot._module is None and ticker._module is None, "|", loaded())
import kdcollapse.analysis._analyze
pyplot.figure  # the first plot loads matplotlib
print("REPORT |", loaded())
"""


@pytest.fixture(scope="module")
def probe() -> dict[str, list[str]]:
    """What each stage of ``_PROBE`` printed: ``{stage: [its words before "|", "|", the heavy packages]}``."""
    code = _PROBE.format(commands=COMMANDS, heavy=HEAVY)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.split()[:1] in
            (["HELPS"], ["PACKAGE"], ["REPORT"])}


def heavy(words: list[str]) -> list[str]:
    return words[words.index("|") + 1:]


def test_help_loads_no_heavy_library(probe):
    assert int(probe["HELPS"][0]) == len(COMMANDS)  # every help was printed: the probe ran the real commands
    assert heavy(probe["HELPS"]) == [], f"`kdcollapse COMMAND --help` imported {heavy(probe['HELPS'])}"


def test_the_package_imports_no_heavy_library_until_used(probe):
    """Not torchmetrics (whose import loads transformers, scipy.signal and matplotlib: kdcollapse.metrics has
    its own ``Metric`` base), scipy (BLAS and the F distribution load on use), PIL (on the first decode)."""
    assert probe["PACKAGE"][0] == "True"  # kdcollapse._optional has not loaded pyplot
    assert heavy(probe["PACKAGE"]) == []


def test_the_probe_sees_a_heavy_import(probe):
    """The check can fail: once the analysis report draws, matplotlib is loaded."""
    assert "matplotlib" in heavy(probe["REPORT"])


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
