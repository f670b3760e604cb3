"""Experiment trackers beside ``metrics.jsonl``: Weights & Biases and MLflow, when installed and asked for
(``train.trackers=[wandb, mlflow]``). Each run logs its config and every epoch record; ``train.group`` (a
study's name, set by ``kdcollapse study``) groups the runs of one study: the W&B group and tag, the MLflow
experiment and tag ``kdcollapse.group``.

Both keep their own defaults for where they write: ``WANDB_MODE=offline`` keeps W&B on disk (under the run
directory), ``MLFLOW_TRACKING_URI`` picks MLflow's store (a local ``mlruns`` folder without it). A resumed
run continues the same tracked run (its id is derived from the run directory); MLflow is then given the committed
epochs it does not hold (a crash between an epoch's commit and its log), W&B is not (see ``WandbTracker.replay``).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from kdcollapse._optional import require

TRACKERS = ("wandb", "mlflow")


def _numbers(record: dict) -> dict[str, float]:
    return {k: float(v) for k, v in record.items()
            if k != "epoch" and isinstance(v, (int, float)) and not isinstance(v, bool)}


def _run_id(run_dir: Path) -> str:
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


class WandbTracker:
    def __init__(self, run_dir: Path, config: dict, group: str):
        wandb = require("wandb", "train.trackers=[wandb]")
        self.run = wandb.init(project="kdcollapse", dir=str(run_dir), id=_run_id(run_dir), resume="allow",
                              name=Path(run_dir).name, group=group or None, tags=[group] if group else None,
                              config=config)

    def log(self, record: dict) -> None:
        self.run.log(_numbers(record), step=int(record["epoch"]))

    def replay(self, records: list[dict]) -> None:
        """Not done for W&B: which steps a resumed run holds is known only to its server (an offline run
        resumes as a new local segment that starts at step 0), so a committed epoch whose log a crash
        interrupted stays missing there; ``metrics.jsonl`` has it."""

    def close(self) -> None:
        self.run.finish()


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
            self.client.log_metric(self.run_id, key, value, step=int(record["epoch"]))

    def replay(self, records: list[dict]) -> None:
        """Log the values of the committed ``records`` (a resumed run's) that the tracked run does not hold
        (a crash after a commit and before its log), each (key, epoch) once: MLflow keeps every value logged."""
        keys = sorted({k for record in records for k in _numbers(record)})
        held = {k: {m.step for m in self.client.get_metric_history(self.run_id, k)} for k in keys}
        for record in records:
            for key, value in _numbers(record).items():
                if int(record["epoch"]) not in held[key]:
                    self.client.log_metric(self.run_id, key, value, step=int(record["epoch"]))

    def close(self) -> None:
        self.client.set_terminated(self.run_id)


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
