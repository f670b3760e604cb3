"""Run a list of training jobs in one process, skipping those already finished; a diverged run is a result.

    PYTHONPATH=src python results/distillation/run_queue.py JOBS

``JOBS``: one job a line, ``RUN_DIR CONFIG key=value ...`` (``#`` starts a comment), run in file order.
Several processes can share a list: each claims a job by creating ``RUN_DIR.claim`` (holding its pid)
atomically, and takes over a claim whose process is gone. Each run
ends with ``RUN_DIR/outcome.json``: ``{"status": "finished" | "diverged", "epochs_done": N, "message": ...,
"max_logit": ...}``, where ``max_logit`` is the largest student logit on the run's validation split (test
split if it has none) of the last saved model (for a diverged run: the last good epoch; the DHKD paper's
official BinaryKL is inf/NaN once a logit exceeds 24·ln 2·τ). A job whose ``outcome.json`` exists is skipped.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from kdcollapse.config import load_config
from kdcollapse.data import make_loader
from kdcollapse.runs import Run, read_metrics
from kdcollapse.train import TrainingDiverged, fit


@torch.no_grad()
def max_logit(run_dir: Path) -> float | None:
    """Largest logit of the run's last saved model on its validation (else test) split; None without one."""
    if not (run_dir / "model.safetensors").is_file():
        return None
    run = Run(run_dir)
    split = "val" if run.config.data.val_per_class > 0 else "test"
    model, _ = run.model()
    model.eval()
    loader = make_loader(run.dataset(split), 500, train=False, device="cpu", seed=0)
    return max(float(model(x).max()) for x, _ in loader)


def claim(run_dir: Path) -> bool:
    """Whether this process may run ``run_dir``: not finished, and not claimed by a live process."""
    if (run_dir / "outcome.json").is_file():
        return False
    token = run_dir.with_name(run_dir.name + ".claim")
    token.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(token, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        try:
            os.kill(int(token.read_text() or 0), 0)
            return False  # its claimer is alive
        except (ProcessLookupError, ValueError):
            token.write_text(str(os.getpid()))  # a stale claim: take it over
            return True
    with os.fdopen(fd, "w") as f:
        f.write(str(os.getpid()))
    return True


def run_job(line: str) -> None:
    run_dir, config, *overrides = shlex.split(line)
    run_dir = Path(run_dir)
    if not claim(run_dir):
        return
    cfg = load_config(config, [*overrides, f"run_dir={run_dir}", "train.progress=false"])
    start = time.time()
    try:
        fit(cfg, overwrite=True)
        status, message = "finished", ""
    except TrainingDiverged as err:
        status, message = "diverged", str(err)
    outcome = {"status": status, "epochs_done": len(read_metrics(run_dir)), "message": message,
               "max_logit": max_logit(run_dir), "wall_s": round(time.time() - start, 1)}
    (run_dir / "outcome.json").write_text(json.dumps(outcome, indent=1) + "\n")
    print(run_dir, outcome["status"], outcome["epochs_done"], flush=True)


def main(jobs: Path) -> None:
    for line in jobs.read_text().splitlines():
        if line.split("#")[0].strip():
            run_job(line.split("#")[0])


if __name__ == "__main__":
    main(Path(sys.argv[1]))
