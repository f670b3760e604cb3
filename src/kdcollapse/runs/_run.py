"""``Run``: one object for a finished or running ``kdcollapse train``/``distill`` run directory."""

from __future__ import annotations

import json
from functools import cached_property
from pathlib import Path

import torch
from torch import nn

from kdcollapse.config import RunConfig
from kdcollapse.config_lm import LMConfig, load_run_config
from kdcollapse.errors import CheckpointError, KdcollapseError
from kdcollapse.methods import get_method
from kdcollapse.models.heads import layers_from_spec
from kdcollapse.runs import _checkpoint as ckpt
from kdcollapse.runs._commit import STATE_FILE, committed_path
from kdcollapse.runs._derived import (OUTPUTS_FILE, ROBUST_EVAL_FILE, outputs_stale, read_outputs, read_robust_eval, seal_problem,
                                      stale_reason)
from kdcollapse.runs._lock import is_locked
from kdcollapse.runs._data import UserData, check_split, run_dataset
from kdcollapse.runs._metrics_log import read_committed_metrics
from kdcollapse.runs._record import check_config_unedited
from kdcollapse.runs._load import load_model, load_teacher

MODEL_FILES = {"model": "model.safetensors", "best": "best.safetensors"}


class Run:
    """A run directory: its config, its data exactly as training saw it (``data.classes``, subsets), its
    model (last or best), its teacher and the extra trainable heads of its method.

    A run trained on data passed from Python (``fit(cfg, train_data=..., test_data=...)``) gets the same
    data here again (checked against the fingerprint in its ``run.json``); without it, ``dataset`` says so.

    >>> Run("no/such/dir")
    Traceback (most recent call last):
    kdcollapse.errors.CheckpointError: run directory not found: no/such/dir
    """

    def __init__(self, run_dir: str | Path, *, train_data=None, test_data=None, val_data=None):
        self.dir = Path(run_dir)
        if not self.dir.is_dir():
            raise CheckpointError(f"run directory not found: {self.dir}")
        if not (self.dir / "config.yaml").is_file():
            raise CheckpointError(
                f"{self.dir} holds no config.yaml, so it is not a `kdcollapse train` run directory"
            )
        self._files: dict[int, Path] = {}  # id of a model read by model() -> its file (heads() reads it)
        self.user_data = UserData.of(train_data, test_data, val_data)
        if self.user_data is not None:
            self.user_data.check_run(self.dir)

    @cached_property
    def config(self) -> RunConfig | LMConfig:
        """The run's config: a :class:`RunConfig` (image runs) or an :class:`LMConfig` (``distill-lm`` runs)."""
        check_config_unedited(self.dir)  # the config describes the weights only as the run wrote it
        return load_run_config(self.dir / "config.yaml")

    @property
    def task(self) -> str:
        """``"image"`` or ``"lm"`` (a ``kdcollapse distill-lm`` run)."""
        return "lm" if isinstance(self.config, LMConfig) else "image"

    def dataset(self, split: str, per_class: int | None = None):
        """Split ``split`` as the run saw it (see :func:`kdcollapse.runs.run_dataset`)."""
        return run_dataset(self.config, split, per_class, user=self.user_data)

    def metrics(self) -> list[dict]:
        """The per-epoch records of ``metrics.jsonl`` up to the last committed epoch (``state.json``), also
        between a crash and its ``--resume``; a file whose SHA-256 is not the one ``state.json`` records (edited
        or damaged) is a ``CheckpointError``; only a torn last line after the committed bytes (an older
        version's interrupted append) is dropped, with a warning."""
        return read_committed_metrics(self.dir)

    def analysis(self, split: str = "test", *, stale_ok: bool = False) -> dict:
        """The report ``kdcollapse analyze`` wrote into ``analysis_<split>/analysis.json``. One computed from
        other weights than the committed ``model.safetensors`` (before ``--resume`` trained further, or
        copied from another run) is a ``CheckpointError`` naming the command that renews it; with
        ``stale_ok`` it is returned with the reason under ``"stale"``."""
        path = self.dir / f"analysis_{check_split(split)}" / "analysis.json"
        if not path.is_file():
            raise CheckpointError(f"{path} not found; run `kdcollapse analyze {self.dir} --split {split}`")
        report, reason = self._report(path)
        if report is None:
            raise CheckpointError(f"{path} is damaged ({reason}); run `kdcollapse analyze {self.dir} --split "
                                  f"{split}` again")
        if reason is not None and not stale_ok:
            raise CheckpointError(f"{path} is stale: {reason}; run `kdcollapse analyze {self.dir} --split {split}` "
                                  "again")
        return report if reason is None else {**report, "stale": reason}

    def _report(self, path: Path) -> tuple[dict | None, str | None]:
        """``(analysis.json, why it is stale or None)``; ``(None, why it cannot be read)`` if damaged."""
        try:
            report = json.loads(path.read_text())
        except (ValueError, UnicodeDecodeError) as err:
            return None, str(err)
        if not isinstance(report, dict):
            return None, "not a JSON object"
        return report, seal_problem(report) or stale_reason(report, self.dir)

    def stale_outputs(self) -> dict[str, str]:
        """The derived outputs in the run directory that no longer describe its committed weights or metrics,
        or are damaged or edited: ``analysis.json`` of ``analysis_<split>/`` or any other folder there, the entries
        of ``robust_eval.json``, and the figures ``outputs.json`` lists (``plot``/``analyze --out`` into the run
        directory): ``{output: reason}``."""
        found = {}
        try:  # analyze --lm reports: checked against their model directory by outputs_stale
            of_lm = {rel for rel, entry in read_outputs(self.dir).items() if "lm" in (entry.get("source") or {})}
        except CheckpointError:
            of_lm = set()
        for path in sorted(self.dir.glob("**/analysis.json")):  # analysis_<split>/ and any other --out folder
            if path.relative_to(self.dir).as_posix() in of_lm:
                continue
            report, reason = self._report(path)
            if reason:
                found[str(path.relative_to(self.dir))] = reason if report else f"it is damaged ({reason})"
        try:
            found |= outputs_stale(self.dir)
        except CheckpointError as err:
            found[OUTPUTS_FILE] = str(err)
        try:
            entries = read_robust_eval(self.dir)
        except CheckpointError as err:
            found[ROBUST_EVAL_FILE] = str(err)
            entries = {}
        for key, entry in entries.items():
            reason = seal_problem(entry, key) or stale_reason(entry, self.dir)
            if reason:
                found[f"{ROBUST_EVAL_FILE}: {key}"] = reason
        return found

    def robust_eval(self, *, stale_ok: bool = False) -> dict[str, dict]:
        """The entries ``kdcollapse robust-eval`` wrote into ``robust_eval.json`` (none if absent). An entry edited
        after it was written (its ``content_sha256`` does not match), or computed from other weights than the
        committed model file it names, is a ``CheckpointError`` naming the entry; with ``stale_ok`` such
        entries are returned with the reason under ``"stale"``."""
        entries = read_robust_eval(self.dir)
        out = {}
        for key, entry in entries.items():
            reason = seal_problem(entry, key) or stale_reason(entry, self.dir)
            if reason is not None and not stale_ok:
                raise CheckpointError(f"{self.dir / ROBUST_EVAL_FILE} entry {key!r} is stale: {reason}; run that "
                                      f"evaluation again (`kdcollapse robust-eval {self.dir} ...`)")
            out[key] = entry if reason is None else {**entry, "stale": reason}
        return out

    def finished(self) -> bool:
        """Whether the run recorded its last epoch (``train.epochs``); a model file alone is also written by
        an interrupted run."""
        if not (self.dir / "metrics.jsonl").is_file():
            return False
        if self.task == "lm":  # an LM run's records are its evaluated steps; the last step is always evaluated
            return any(r.get("step") == self.config.steps for r in self.metrics())
        return any(r.get("epoch") == self.config.train.epochs for r in self.metrics())

    def model(self, which: str = "model", device: str | torch.device = "cpu") -> tuple[nn.Module, dict]:
        """``(model, meta)`` of the last (``which="model"``) or best (``"best"``) committed epoch."""
        if which not in MODEL_FILES:
            raise KdcollapseError(f"unknown model file {which!r}; valid: {', '.join(MODEL_FILES)}")
        if self.task == "lm":
            raise KdcollapseError(f"{self.dir} is a distill-lm run: its student is the folder {self.dir / 'student'} "
                                  "(kdcollapse.lm.load_language_model opens it)")
        path = committed_path(self.dir, MODEL_FILES[which])
        model, meta = load_model(path, device)
        self._files[id(model)] = path
        return model, meta

    def teacher(self, dataset=None, device: str | torch.device = "cpu") -> nn.Module | None:
        """The run's frozen teacher (``None`` for a run trained without one)."""
        cfg = self.config
        if not (cfg.teacher.checkpoint or cfg.teacher.weights):
            return None
        return load_teacher(cfg.teacher, dataset or self.dataset("test")).model.to(device)

    def heads(self, model: nn.Module, meta: dict, device: str | torch.device = "cpu") -> dict[str, nn.Module]:
        """Trainable heads of the method beyond the student (a dual-head student's ``aux``), with the weights
        of the same epoch as ``model`` (from :meth:`model`): read from its model file, which carries them.
        Runs written before model files carried them: a linear head is read from the checkpoint."""
        path = self._files.get(id(model))
        if path is not None and "extra_heads" in meta:
            tensors, _ = ckpt.load_tensors(path, device=device)
            return ckpt.read_extra_heads(tensors, meta)
        return self._linear_heads_of_checkpoint(meta, device)

    def _linear_heads_of_checkpoint(self, meta: dict, device) -> dict[str, nn.Module]:
        extra = get_method(self.config.method.name).extra_heads
        if not extra or not (self.dir / "checkpoint.safetensors").is_file():
            return {}
        path = committed_path(self.dir, "checkpoint.safetensors")
        tensors, state_meta = ckpt.load_tensors(path, device=device)
        if state_meta.get("epoch") != meta.get("epoch"):
            raise CheckpointError(
                f"{self.dir}: model.safetensors is from epoch {meta.get('epoch')} but checkpoint.safetensors "
                f"(which holds the auxiliary head) from epoch {state_meta.get('epoch')}"
            )
        heads = {}
        for label, attr in extra.items():
            state = ckpt.split_prefix(tensors, f"method.{attr}.")
            if set(state) == {"weight", "bias"} and state["weight"].dim() == 2:
                out_features, in_features = state["weight"].shape
                spec = [{"type": "Linear", "in": in_features, "out": out_features, "bias": True}]
                heads[label] = layers_from_spec(spec, state)
        return heads


__all__ = ["Run", "check_split", "run_dataset"]


RUN_STATES = ("new", "interrupted", "running", "finished")


def run_state(run_dir: str | Path) -> str:
    """Where the run in ``run_dir`` stands, by one rule: "running" while a process holds its lock, "finished"
    when :meth:`Run.finished` says so, "interrupted" when an epoch was committed (``state.json``) but not the
    last, "new" otherwise (nothing committed: a start that crashed before its first epoch included)."""
    run_dir = Path(run_dir)
    if is_locked(run_dir):
        return "running"
    if not (run_dir / "config.yaml").is_file():
        return "new"
    if Run(run_dir).finished():
        return "finished"
    return "interrupted" if (run_dir / STATE_FILE).is_file() else "new"
