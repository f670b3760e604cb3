"""A real preemption on the one-node SLURM cluster of `.ci/slurm.sh`: `scontrol requeue` kills a study's job in
the middle of its run, SLURM starts it again, and the run resumes from its last committed epoch (the epochs
logged before the kill are kept byte for byte) and ends bit for bit the run that never stopped.

Heavy (SLURM holds a requeued job for about two minutes before it starts again): `pytest -m heavy
tests/test_study_requeue.py`, after `bash .ci/slurm.sh` as root."""

from __future__ import annotations

import json
import subprocess
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from conftest import TINY_RUN
from kdcollapse.runs import load_tensors
from kdcollapse.study import execute, load_study, pending, submit_slurm
from test_study import slurm_unreachable

STUDY = """
name: requeue
seeds: [0]
groups:
  - group: plain
    run: plain/seed{seed}
    config: CONFIG
    overrides: [TINY, train.epochs=300, data.val_per_class=5]
"""


def metrics(run_dir: Path) -> list[dict]:
    return [{k: v for k, v in json.loads(line).items() if k not in ("images_per_s", "epoch_time_s")}
            for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.heavy
def test_a_requeued_slurm_job_resumes_its_run_exactly(tmp_path):
    why = slurm_unreachable()
    if why:
        pytest.skip(why)
    pytest.importorskip("submitit", reason="the SLURM executor needs submitit (pip install 'kdcollapse[slurm]')")
    (tmp_path / "plain.yaml").write_text("method: {name: vanilla}\n")
    tiny = "[" + ", ".join(json.dumps(o) for o in TINY_RUN) + "]"
    path = tmp_path / "study.yaml"
    path.write_text(STUDY.replace("CONFIG", str(tmp_path / "plain.yaml")).replace("TINY", tiny))
    study = load_study(path, runs_dir=tmp_path / "slurm")
    spec = study.runs["plain/seed0"]
    (job,) = submit_slurm(study, pending(study), tmp_path / "submitit", threads=1)
    log = spec.run_dir / "metrics.jsonl"
    deadline = time.time() + 300
    while not (log.is_file() and log.read_text().count("\n") >= 20):
        assert time.time() < deadline, "the job did not log 20 epochs in 5 minutes"
        time.sleep(0.05)
    subprocess.run(["scontrol", "requeue", job.job_id], check=True, capture_output=True)
    before = log.read_text().splitlines()  # what the killed job had logged (at least 20 epochs)
    assert job.result().status == "finished"
    text = (tmp_path / "submitit" / job.job_id.split("_")[0]).glob("*_log.err")
    assert any("DUE TO JOB REQUEUE" in f.read_text() for f in text), "the job was not preempted"
    after = log.read_text().splitlines()
    # resumed, not restarted: the epochs committed before the kill keep their lines (timings included) as written
    assert len(after) == 300 and after[:10] == before[:10]
    never_stopped = tmp_path / "local"
    assert execute(replace(spec, run_dir=never_stopped, overrides=(*spec.overrides, f"run_dir={never_stopped}")),
                   1).status == "finished"
    assert metrics(spec.run_dir) == metrics(never_stopped)
    a, _ = load_tensors(spec.run_dir / "model.safetensors")
    b, _ = load_tensors(never_stopped / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
