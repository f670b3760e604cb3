"""Experiment trackers beside ``metrics.jsonl``: Weights & Biases and MLflow, when installed and asked for
(``train.trackers=[wandb, mlflow]``). Each run logs its config, every epoch record and the per-step scalars
(:func:`tracker_rows`); ``train.group`` (a study's name, set by ``kdcollapse study``) groups the runs of one
study: the W&B group and tag, the MLflow experiment and tag ``kdcollapse.group``.

Both keep their own defaults for where they write: ``WANDB_MODE=offline`` keeps W&B on disk (under the run
directory), ``MLFLOW_TRACKING_URI`` picks MLflow's store (a local ``mlruns`` folder without it). A resumed
run continues the same tracked run (its id is derived from the run directory) and is given the committed epochs it
does not hold (a crash between an epoch's commit and its log), each once: MLflow's from its store, W&B's from the
run's local transaction logs (see ``WandbTracker.replay``).
"""

from __future__ import annotations

import hashlib
import json
import struct
import time
import warnings
from pathlib import Path

from kdcollapse._optional import require

TRACKERS = ("wandb", "mlflow")


def record_step(record: dict) -> int:
    """The x of a metrics record: its ``epoch`` (image runs) or its ``step`` (language-model runs)."""
    return int(record["epoch"] if "epoch" in record else record["step"])


def value_step(record: dict, key: str) -> int:
    """The x of one value of a tracked row (:func:`tracker_rows`): the optimizer step for a per-step scalar
    (``step/<key>``), the record's :func:`record_step` for the others."""
    return int(record["step"]) if key.startswith("step/") else record_step(record)


def tracker_rows(steps: list[dict], records: list[dict]) -> list[dict]:
    """The rows the trackers and TensorBoard are given, for both tasks: each per-step record (``step``, an
    image run's ``epoch``, scalars) as ``{"step": s, "step/<key>": value}``, and each commit record merged into
    the row of the last step it covers (an image run's epoch record gains that ``step``; a language-model
    run's record is already one of a step). W&B, whose x is one increasing step per run, logs each row at its
    ``step`` (an image epoch record without per-step records: at its epoch); MLflow and TensorBoard log each
    value at :func:`value_step`, so an image run's epoch values keep the epoch as x."""
    rows = {int(r["step"]): {"step": int(r["step"]), **{f"step/{k}": v for k, v in r.items()
                                                         if k not in ("step", "epoch")}} for r in steps}
    last_of_epoch = {int(r["epoch"]): int(r["step"]) for r in steps if "epoch" in r}
    alone = []
    for record in records:
        at = int(record["step"]) if "step" in record else last_of_epoch.get(int(record["epoch"]))
        if at is None:
            alone.append(record)
        else:
            rows.setdefault(at, {"step": at}).update(record)
    return alone + [rows[s] for s in sorted(rows)]


def wandb_step(row: dict) -> int:
    return int(row.get("step", row.get("epoch", 0)))


def _numbers(record: dict) -> dict[str, float]:
    return {k: float(v) for k, v in record.items()
            if k not in ("epoch", "step") and isinstance(v, (int, float)) and not isinstance(v, bool)}


def numbers(record: dict) -> dict[str, float]:
    """The numeric values of a tracked row, less its x (``step``, ``epoch``)."""
    return _numbers(record)


def _run_id(run_dir: Path) -> str:
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


class WandbTracker:
    def __init__(self, run_dir: Path, config: dict, group: str):
        wandb = require("wandb", "train.trackers=[wandb]")
        self.run = wandb.init(project="kdcollapse", dir=str(run_dir), id=_run_id(run_dir), resume="allow",
                              name=Path(run_dir).name, group=group or None, tags=[group] if group else None,
                              config=config)

    def log(self, record: dict) -> None:
        epoch = {"epoch": float(record["epoch"])} if "epoch" in record and "step" in record else {}
        self.run.log(_numbers(record) | epoch, step=wandb_step(record))

    def replay(self, records: list[dict]) -> None:
        """Log the committed ``records`` (a resumed run's) after the last step the run's earlier segments logged
        (a crash after a commit and before its log). W&B writes every segment of a run, offline or online, to a
        local transaction log, ``wandb/[offline-]run-<time>-<id>/run-<id>.wandb`` under the run directory; a
        resume starts a new segment of the same id, and ``wandb sync`` uploads the segments of one run in order
        of their start. Only the local logs are read (tested offline; an online run's server is not asked)."""
        if self.run.settings.mode == "disabled":
            return
        here = Path(self.run.dir).parent
        earlier = [p for p in sorted(here.parent.glob(f"*run-*-{self.run.id}/run-{self.run.id}.wandb"))
                   if p.parent != here]
        try:
            last = max((step for path in earlier for step, _ in wandb_history(path)), default=0)
        except ValueError as e:  # a format this reader does not know: log nothing twice
            warnings.warn(f"W&B: the committed epochs a crash kept from the run are not replayed ({e})", stacklevel=2)
            return
        for record in records:
            if wandb_step(record) > last:
                self.log(record)

    def close(self, failed: bool = False) -> None:
        """Finish the run (exit code 1 when training ``failed``) and wait (up to a minute) until W&B's service
        has written its transaction log to the end: ``finish`` returns before that, and a resume in the same
        process reads the log (:meth:`replay`)."""
        path = Path(self.run.dir).parent / f"run-{self.run.id}.wandb"
        self.run.finish(exit_code=1 if failed else 0)
        if self.run.settings.mode == "disabled":  # WANDB_MODE=disabled: no log is written
            return
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                if any(record.WhichOneof("record_type") == "exit" for record in wandb_records(path)):
                    return
            except (OSError, ValueError):
                pass
            time.sleep(0.05)
        warnings.warn(f"W&B had not finished writing {path} a minute after the run's end", stacklevel=2)


def wandb_records(path: Path) -> list:
    """The protobuf ``Record`` messages of one W&B transaction log (``run-<id>.wandb``): a LevelDB-style log of
    32 KiB blocks after a 7-byte header (``:W&B``, 0xBEE1, version 0), each record a 7-byte header (checksum,
    length, kind: 1 whole, 2 first, 3 middle, 4 last part) and its bytes. A record torn by a crash ends the
    list; a file of another format raises ``ValueError``."""
    from google.protobuf.message import DecodeError
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:7] != b":W&B\xe1\xbe\x00":
        raise ValueError(f"{path} is not a W&B transaction log of version 0")
    records, pos, part = [], 7, b""
    while pos + 7 <= len(data):
        room = 32768 - pos % 32768
        if room < 7:  # a block's tail too short for a header is padding
            pos += room
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0 or pos + 7 + length > len(data):  # padding, or a torn last record
            break
        part += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):
            try:
                records.append(wandb_internal_pb2.Record.FromString(part))
            except DecodeError:
                break
            part = b""
    return records


def wandb_history(path: Path) -> list[tuple[int, dict]]:
    """The history records of one W&B transaction log (:func:`wandb_records`) as (step, {key: value})."""
    return [(int(r.history.step.num),
             {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in r.history.item})
            for r in wandb_records(path) if r.WhichOneof("record_type") == "history"]


class MlflowTracker:
    def __init__(self, run_dir: Path, config: dict, group: str):
        self.mlflow = require("mlflow", "train.trackers=[mlflow]")
        client = self.mlflow.MlflowClient()
        name = group or "kdcollapse"
        experiment = client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else client.create_experiment(name)
        tag = {"kdcollapse.run_id": _run_id(run_dir)}
        found = client.search_runs([experiment_id], filter_string=f"tags.`kdcollapse.run_id` = '{tag['kdcollapse.run_id']}'")
        if found:
            self.run_id = found[0].info.run_id
        else:
            run = client.create_run(experiment_id, run_name=Path(run_dir).name,
                                    tags={**tag, "kdcollapse.group": group, "kdcollapse.run_dir": str(run_dir)})
            self.run_id = run.info.run_id
            for key, value in _flat(config).items():
                client.log_param(self.run_id, key, value)
        self.client = client

    def log(self, record: dict) -> None:
        for key, value in _numbers(record).items():
            self.client.log_metric(self.run_id, key, value, step=value_step(record, key))

    def replay(self, records: list[dict]) -> None:
        """Log the values of the committed ``records`` (a resumed run's) that the tracked run does not hold
        (a crash after a commit and before its log), each (key, x) once: MLflow keeps every value logged."""
        keys = sorted({k for record in records for k in _numbers(record)})
        held = {k: {m.step for m in self.client.get_metric_history(self.run_id, k)} for k in keys}
        for record in records:
            for key, value in _numbers(record).items():
                if value_step(record, key) not in held[key]:
                    self.client.log_metric(self.run_id, key, value, step=value_step(record, key))

    def close(self, failed: bool = False) -> None:
        self.client.set_terminated(self.run_id, status="FAILED" if failed else "FINISHED")


def _flat(config: dict, prefix: str = "") -> dict[str, str]:
    out = {}
    for key, value in config.items():
        if isinstance(value, dict):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = str(value)[:500]
    return out


def open_trackers(names, run_dir: Path, config: dict, group: str) -> list:
    """One tracker per name in ``names`` (each of ``TRACKERS``)."""
    kinds = {"wandb": WandbTracker, "mlflow": MlflowTracker}
    return [kinds[name](run_dir, config, group) for name in names]
