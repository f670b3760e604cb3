"""A run directory the user may not write (issue 28, item 2: a read-only run directory gave tracebacks, one of them
after robust-eval's whole attack had run): every command that would write into it stops with one ``error:`` line
naming it and changes nothing, while the commands that only read it (a teacher, ``Run``) work.

Permissions do not bind root, so as root the commands run as user ``nobody`` (``setpriv``) on a run root owns;
otherwise the run's files and folder are made read-only with ``chmod``. Every command runs in one subprocess
(``kdcollapse.cli.main`` in turn), which prints one JSON line per command: its exit status and its stderr."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from kdcollapse.config import load_config
from kdcollapse.train import fit

SRC = str(Path(__file__).parents[1] / "src")
TINY = ["data.name=digits", "data.batch_size=64", "train.progress=false", "optim.lr=0.05", "schedule.name=constant",
        "model.name=mlp", "model.kwargs={input_size: 8, hidden: [16]}", "train.device=cpu", "train.epochs=1"]
ROBUST = ["--attacks", "pgd", "--pgd-steps", "1", "--n-examples", "8", "--eps", "0.1", "--no-progress"]

# commands that write into the read-only run "ro": each must be refused ("{out}" is a folder the user may write)
REFUSED = [
    ["analyze", "ro", "--no-progress"],
    ["analyze", "ro", "--split", "train", "--no-progress"],
    ["analyze", "ro", "--out", "ro/mine", "--no-progress"],
    ["robust-eval", "ro", *ROBUST],
    ["train", "--resume", "ro", "train.epochs=2", "--quiet"],
    ["train", "--config", "ro/config.yaml", "run_dir=ro", "--overwrite", "--quiet"],
    ["train", "--config", "ro/config.yaml", "run_dir=ro/inner", "--quiet"],
    ["plot", "ro", "--out", "ro/curves.png"],
]
# commands that only read it: the run as a teacher, its figures written elsewhere
READ = [
    ["distill", "--config", "c.yaml", "run_dir={out}/student", "method.name=kd", "teacher.checkpoint=ro", "--quiet"],
    ["analyze", "ro", "--out", "{out}/analysis", "--no-progress"],
]

SCRIPT = """
import contextlib, io, json, sys
from kdcollapse.cli import main
from kdcollapse.runs import Run
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            status = main(argv)
        except BaseException as e:  # a traceback would be a failure of the test: report it as such
            status, err = repr(e), io.StringIO(repr(e))
    print(json.dumps({"argv": argv, "status": status, "stderr": err.getvalue()}), flush=True)
print(json.dumps({"epochs": [r["epoch"] for r in Run("ro").metrics()]}), flush=True)
"""


def snapshot(folder: Path) -> dict:
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns, p.stat().st_mode) if p.is_file()
            else p.stat().st_mode for p in folder.rglob("*")}


def read_only_user() -> list[str]:
    """The command prefix that runs a subprocess without the right to write the run (as root: user nobody)."""
    if os.geteuid() != 0:
        return []
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        pytest.skip("running as root without setpriv: no way to run a command without write permission")
    return [setpriv, "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture(scope="module")
def workspace():
    """A folder everyone may read holding the one-epoch run "ro" (read-only to the commands) and "out" (writable)."""
    ws = Path(tempfile.mkdtemp(prefix="kdcollapse_ro_"))
    try:
        fit(load_config(None, [*TINY, f"run_dir={ws / 'ro'}"]))
        (ws / "out").mkdir()
        (ws / "c.yaml").write_text("data: {name: digits, batch_size: 64}\nmodel: {name: mlp, kwargs: {input_size: 8, "
                                   "hidden: [16]}}\noptim: {lr: 0.05}\nschedule: {name: constant}\n"
                                   "train: {epochs: 1, progress: false, device: cpu}\n")
        (ws / "home").mkdir()
        for folder in (ws, ws / "out", ws / "home"):
            folder.chmod(0o777 if folder != ws else 0o755)
        if os.geteuid() != 0:  # the owner: take the write permission away
            for path in [*(ws / "ro").rglob("*"), ws / "ro"]:
                path.chmod(path.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
        yield ws
    finally:
        for path in [ws / "ro", *(ws / "ro").rglob("*")]:
            if path.exists():
                path.chmod(path.stat().st_mode | stat.S_IWUSR)
        shutil.rmtree(ws, ignore_errors=True)


def test_a_read_only_run_is_refused_by_every_writer_and_read_by_every_reader(workspace):
    prefix = read_only_user()
    before = snapshot(workspace / "ro")
    argvs = [*REFUSED, *[[a.format(out="out") for a in argv] for argv in READ]]
    env = {**os.environ, "PYTHONPATH": SRC, "HOME": str(workspace / "home"),
           "MPLCONFIGDIR": str(workspace / "home"), "OMP_NUM_THREADS": "1"}
    done = subprocess.run([*prefix, sys.executable, "-c", SCRIPT, json.dumps(argvs)], env=env, cwd=workspace,
                          capture_output=True, text=True, timeout=900)
    if prefix and not done.stdout and any(w in done.stderr for w in ("Permission denied", "ModuleNotFoundError")):
        pytest.skip(f"user nobody cannot run this interpreter or import kdcollapse: {done.stderr.strip()[-200:]}")
    assert done.returncode == 0, done.stderr[-3000:]
    *results, read_back = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    assert [r["argv"] for r in results] == argvs
    for result in results[:len(REFUSED)]:
        err = result["stderr"]
        assert result["status"] == 2, result
        assert err.startswith("error: ") and err.count("\n") == 1 and "ro" in err, result
        assert any(word in err for word in ("Permission denied", "read-only", "cannot write")), result
    for result in results[len(REFUSED):]:
        assert result["status"] == 0, result
    assert read_back == {"epochs": [1]}  # Run reads the read-only run, its checksums verified
    assert snapshot(workspace / "ro") == before  # nothing written, no lock or temporary left
    assert (workspace / "out" / "student" / "model.safetensors").is_file()
    assert (workspace / "out" / "analysis" / "analysis.json").is_file()
