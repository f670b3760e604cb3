"""kill -9 at random instants of a distillation with extra state (CRD's memory banks, MLKD's multi-level
augmented views, CTKD's learned temperature), then ``--resume``: does each run end bit-identical to an
uninterrupted one, or is the resume refused with one ``error:`` line? (issue 42, the fault campaign)

    PYTHONPATH=src python benchmarks/fault_campaign.py --trials 8 --markdown results/faults.md

Every run is a real ``python -m kdcollapse distill`` process on the digits (tiny MLP student and teacher, a
few epochs), killed with SIGKILL at a time drawn uniformly over the uninterrupted run's wall time from the moment its
``config.yaml`` is written (imports and start-up excluded; seeded), then
resumed, in a process of its own, as often as it takes to finish (a refused resume ends the trial). The final
checkpoint's tensors (student, optimizer, method state, random state) and the metrics log without timings are
compared with the uninterrupted run's.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BASE = ["data.name=digits", "data.batch_size=50", "data.train_per_class=20", "data.test_per_class=10",
        "train.progress=false", "optim.lr=0.05", "schedule.name=constant", "model.name=mlp",
        "model.kwargs={input_size: 8, hidden: [16]}"]
METHODS = {"crd": ["method.name=crd", "method.num_negatives=16", "method.feat_dim=8"],
           "mlkd": ["method.name=mlkd", "data.crop_padding=1"],  # its views need an augmentation
           "ctkd": ["method.name=ctkd"]}
TIMING = {"images_per_s", "epoch_time_s"}
NOTE = ("What this shows: that a SIGKILL at these instants of these three methods' runs (digits, a tiny MLP, "
        "a few epochs) left a run directory that `--resume` finished bit-identically (checkpoint tensors, "
        "metrics without timings), or refused in one line. What it cannot show: instants not drawn (a handful "
        "per method; the in-suite tests of tests/test_faults.py crash at every write point of an epoch), other "
        "methods, multi-process (DDP) runs, `analyze --lm` and the teacher-token cache (not in this campaign). "
        "'finished before the kill': the drawn instant fell after the run's end (its wall time varies with "
        "the machine's load).")


def kdcollapse(args: list[str], log: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen([sys.executable, "-m", "kdcollapse", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=open(log, "w"))  # noqa: SIM115 - the child holds it


def finished(args: list[str], log: Path) -> tuple[int, str]:
    proc = kdcollapse(args, log)
    proc.wait()
    return proc.returncode, log.read_text()


def same_run(a: Path, b: Path) -> str | None:
    """None if ``b`` ends as ``a``, else what differs."""
    from kdcollapse.runs import load_tensors, read_metrics

    ta, ma = load_tensors(a / "checkpoint.safetensors")
    tb, mb = load_tensors(b / "checkpoint.safetensors")
    if ma["epoch"] != mb["epoch"]:
        return f"epoch {mb['epoch']} against {ma['epoch']}"
    import torch

    differ = sorted(k for k in ta.keys() | tb.keys() if k not in ta or k not in tb or not torch.equal(ta[k], tb[k]))
    if differ:
        return f"{len(differ)} tensors differ ({differ[0]}, ...)"
    strip = [[{k: v for k, v in r.items() if k not in TIMING} for r in read_metrics(d)] for d in (a, b)]
    return None if strip[0] == strip[1] else "metrics.jsonl differs"


def started(proc: subprocess.Popen, run: Path) -> float:
    """Wait until the run has written its config (the interpreter's start and imports are over); the time."""
    start = time.perf_counter()
    while not (run / "config.yaml").exists() and proc.poll() is None:
        time.sleep(0.01)
    return time.perf_counter() - start


def trial(method: str, args: list[str], reference: Path, delay: float, folder: Path) -> tuple[str, str]:
    run = folder / "run"
    proc = kdcollapse([*args, f"run_dir={run}"], folder / "first.err")
    started(proc, run)
    time.sleep(delay)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    if proc.returncode == 0:
        return "finished before the kill", ""
    for attempt in range(5):  # a resume killed by nothing: once is enough; allow a few for safety
        code, err = finished(["distill", "--resume", str(run)], folder / f"resume{attempt}.err")
        lines = [line for line in err.splitlines() if line.strip() and not line.startswith("epoch ")]
        if code == 0:
            diff = same_run(reference, run)
            return ("bit-identical", "") if diff is None else ("DIFFERS", diff)
        if code == 2 and len(lines) == 1 and lines[0].startswith("error: "):
            return "refused, one line", lines[0]
        return "FAILED", err.strip()[-300:]
    return "FAILED", "resume never finished"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=8, help="kills per method")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--methods", default=",".join(METHODS))
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    root = Path(tempfile.mkdtemp(prefix="fault_campaign_"))
    (root / "empty.yaml").write_text("{}\n")  # every setting on the command line
    config = ["--config", str(root / "empty.yaml")]
    code, err = finished(["train", *config, *BASE, "train.epochs=2", f"run_dir={root / 'teacher'}"], root / "teacher.err")
    assert code == 0, err
    rows, outcomes = [], Counter()
    for method in args.methods.split(","):
        command = ["distill", *config, *BASE, *METHODS[method], f"teacher.checkpoint={root / 'teacher'}",
                   f"train.epochs={args.epochs}"]
        start = time.perf_counter()
        proc = kdcollapse([*command, f"run_dir={root / method / 'reference'}"], root / f"{method}.err")
        begun = started(proc, root / method / "reference")
        proc.wait()
        wall = time.perf_counter() - start - begun  # from the config written to the end
        assert proc.returncode == 0, (root / f"{method}.err").read_text()
        for i in range(args.trials):
            delay = rng.uniform(0.0, wall)
            folder = root / method / f"trial{i}"
            folder.mkdir(parents=True)
            outcome, detail = trial(method, command, root / method / "reference", delay, folder)
            outcomes[outcome] += 1
            rows.append((method, f"{delay:.2f} of {wall:.2f}", outcome, detail))
            print(f"{method:5s} kill at {delay:5.2f} s of {wall:5.2f}: {outcome} {detail}", flush=True)
    print(dict(outcomes))
    if args.markdown:
        import torch
        from _timing import cpu_model  # benchmarks/_timing.py

        table = ["| method | kill at (s after config.yaml, of the uninterrupted run's) | outcome | detail |", "|---|---|---|---|"]
        table += [f"| {m} | {d} | {o} | {x.replace('|', '/')} |" for m, d, o, x in rows]
        header = ["# Fault campaign: kill -9 at random instants of crd, mlkd and ctkd distillation",
                  "", f"`PYTHONPATH=src python benchmarks/fault_campaign.py --trials {args.trials} --epochs "
                  f"{args.epochs} --seed {args.seed} --markdown {args.markdown}`; "
                  f"{cpu_model()}, CPU capability {torch.backends.cpu.get_cpu_capability()}, {os.cpu_count()} "
                  "cores (shared, under load); "
                  f"outcomes {json.dumps(dict(outcomes))}.", "", NOTE, ""]
        args.markdown.write_text("\n".join([*header, *table]) + "\n")


if __name__ == "__main__":
    main()
