"""kill -9 of ``kdcollapse analyze --lm`` writing into a distill-lm run directory (issue 42's fault campaign): at any
instant the run's own files stay byte-identical, every report file present is whole (written by rename), the
list of derived outputs reads, and the next ``analyze`` takes the directory's lock and writes the report an
uninterrupted one writes."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("transformers")

pytestmark = pytest.mark.slow

REPORT = ("analysis.json", "token_counts.json", "analysis.md")


def digest(root: Path, names: list[str]) -> dict[str, str]:
    out = {}
    for name in names:
        for path in sorted((root / name).rglob("*") if (root / name).is_dir() else [root / name]):
            if path.is_file():
                out[path.relative_to(root).as_posix()] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def report_of(out: Path) -> dict:
    result = json.loads((out / "analysis.json").read_text())
    return {key: result[key] for key in ("layers", "classes", "perplexity")}


@pytest.fixture(scope="module")
def lm_run(tmp_path_factory):
    from tiny_lm import llama_config, tiny_tokenizer, write_corpus

    from kdcollapse.lm import load_language_model

    root = tmp_path_factory.mktemp("analyze_kill")
    run = root / "run"  # a distill-lm run directory as analyze sees one: config.yaml, run.json, student/
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    (run / "run.json").write_text("{}\n")
    tokenizer = tiny_tokenizer()
    model = load_language_model(llama_config(len(tokenizer), layers=3), tokenizer=tokenizer, seed=0).model
    model.save_pretrained(run / "student")
    tokenizer.save_pretrained(run / "student")
    corpus = write_corpus(root / "text")
    return root, run, corpus


def test_a_kill_9_during_analyze_lm_leaves_the_run_whole_and_the_next_analysis_equal(lm_run, monkeypatch):
    from kdcollapse.cli import main
    from kdcollapse.runs import Run, read_outputs

    root, run, corpus = lm_run
    monkeypatch.setenv("KDCOLLAPSE_CACHE", str(root / "cache"))
    argv = ["analyze", "--lm", str(run / "student"), "--corpus", str(corpus), "--split", "train", "--layers", "all",
            "--block-size", "16", "--no-progress", "--out"]
    assert main([*argv, str(root / "reference")]) == 0  # outside the run: the uninterrupted report
    reference = report_of(root / "reference")
    own = digest(run, ["config.yaml", "run.json", "student"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[1] / "src"), str(Path(__file__).parent)]),
           "OMP_NUM_THREADS": "1", "KDCOLLAPSE_CACHE": str(root / "cache")}
    out = run / "lm_analysis"
    # Kill as soon as the analysis holds the run's lock (the pass under way; on a fast machine the instant may fall
    # later, while the report is written or listed, or after the end: the checks hold at every instant). Two
    # instants cost 10 s more CPU: ANALYZE_KILL_DELAYS=0,0.2,0.4 draws more.
    for delay in [float(d) for d in os.environ.get("ANALYZE_KILL_DELAYS", "0").split(",")]:
        proc = subprocess.Popen([sys.executable, "-m", "kdcollapse", *argv, str(out)], env=env,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while not (run / ".lock").exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(delay)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert digest(run, ["config.yaml", "run.json", "student"]) == own
        for name in REPORT:  # whatever the kill left is whole: each file is written beside and renamed
            if (out / name).is_file() and name.endswith(".json"):
                json.loads((out / name).read_text())
        read_outputs(run)  # the list of derived outputs reads (it is written by rename too)
        Run(run).stale_outputs()
        assert main([*argv, str(out)]) == 0  # the lock of the killed process went with it
        assert report_of(out) == reference
        assert {f"lm_analysis/{name}" for name in REPORT} <= set(read_outputs(run))
        assert Run(run).stale_outputs() == {}
        assert digest(run, ["config.yaml", "run.json", "student"]) == own
