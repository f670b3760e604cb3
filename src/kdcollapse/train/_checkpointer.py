"""The trainer's checkpointer: what one epoch commits to the run directory, and how a resume reads it back.

An epoch commits ``checkpoint.safetensors`` (the method's state dict under ``method.``, the optimizer's
tensors under ``optim.``, the method's ``extra_state()`` under ``extra.``, the weight average under
``ema.``; metadata: the selection state, the optimizer's non-tensor part and the schedule's state),
``model.safetensors`` (the inference model) and, when the epoch improved, ``best.safetensors``, in one
step (``RunEngine.commit``, with the metrics). See docs/ARCHITECTURE.md, "The run directory".
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from kdcollapse.config import RunConfig
from kdcollapse.errors import CheckpointError, KdcollapseError
from kdcollapse.methods import Method
from kdcollapse.runs import (RunDir, check_checkpoint_meta, flatten_optimizer, load_state, load_tensors, model_file,
                             model_meta, on_main_process, split_prefix, unflatten_optimizer)
from kdcollapse.train._optim import BUILTIN_SCHEDULES, check_schedule_length


@dataclass
class Progress:
    """Where a run stands: the first epoch still to train (0-based), and the selection state."""

    start_epoch: int = 0
    best_acc: float = 0.0  # test accuracy (%) of the best epoch
    best_epoch: int = 0  # 1-based; 0 before any evaluation
    last_acc: float = float("nan")
    best_val_acc: float | None = None
    last_val_acc: float | None = None


@dataclass
class Checkpointer:
    """An epoch's weight files (:meth:`epoch_files`, committed by ``RunEngine.commit``), and the restore of a
    run from them. ``inference_model`` gives the network saved as the model files (the weight average when
    ``train.ema`` is on); ``has_val``: whether the run selects its best epoch on a validation split."""

    cfg: RunConfig
    run_files: RunDir
    is_main: bool
    method: Method
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LRScheduler
    ema: torch.nn.Module | None
    inference_model: Callable[[], torch.nn.Module]
    train_set: object
    has_val: bool

    @property
    def run_dir(self):
        return self.run_files.path

    # --------------------------------------------------------------------------------- writing
    def epoch_files(self, epoch: int, progress: Progress, improved: bool) -> dict:
        """The weight files of ``epoch``: the checkpoint, the inference model, and the best model if improved."""
        optim_tensors, optim_rest = flatten_optimizer(self.optimizer.state_dict())
        tensors = {f"method.{k}": v for k, v in self.method.state_dict().items()}
        tensors |= {f"optim.{k}": v for k, v in optim_tensors.items()}
        tensors |= {f"extra.{k}": v for k, v in self.method.extra_state().items()}
        if self.ema is not None:
            tensors |= {f"ema.{k}": v for k, v in self.ema.state_dict().items()}
        meta = self.checkpoint_meta(epoch, progress) | {"optimizer": optim_rest,
                                                        "schedule": self.schedule.state_dict()}
        model = model_file(self.inference_model(), model_meta(self.cfg, self.train_set, epoch=epoch,
                                                              test_acc=progress.last_acc,
                                                              val_acc=progress.last_val_acc), self.extra_heads())
        return {"checkpoint.safetensors": (tensors, meta), "model.safetensors": model,
                **({"best.safetensors": model} if improved else {})}

    def checkpoint_meta(self, epoch: int, progress: Progress) -> dict:
        cfg = self.cfg
        return {
            "format": "kdcollapse.checkpoint", "version": 1, "epoch": epoch, "seed": cfg.seed,
            "model": cfg.model.name, "method": cfg.method.name, "dataset": cfg.data.name,
            "best_acc": progress.best_acc, "best_epoch": progress.best_epoch, "last_acc": progress.last_acc,
            "best_val_acc": progress.best_val_acc, "selected_on": "val" if self.has_val else "test",
        }

    def extra_heads(self) -> dict[str, torch.nn.Module]:
        """The method's extra classifier heads, saved in its model files beside the student."""
        return {label: self.method.get_submodule(attr) for label, attr in self.method.extra_heads.items()}

    # --------------------------------------------------------------------------------- reading
    def resume(self, device: torch.device) -> Progress:
        """Restore the method, weight average, optimizer and schedule from the run's checkpoint and repair
        its model files where the checkpoint can; returns where the run stands."""
        path = self.run_dir / "checkpoint.safetensors"
        tensors, meta = load_tensors(path, device=device)
        check_checkpoint_meta(meta, str(path))
        for key in ("model", "method", "dataset"):
            saved, wanted = meta.get(key), getattr(self.cfg, "data" if key == "dataset" else key).name
            if saved != wanted:
                raise KdcollapseError(
                    f"cannot resume: the checkpoint in {self.run_dir} is for {key} '{saved}', the config asks "
                    f"for '{wanted}'"
                )
        load_state(self.method, split_prefix(tensors, "method."), str(path))
        self.method.load_extra_state(split_prefix(tensors, "extra."))
        if self.ema is not None:
            load_state(self.ema, split_prefix(tensors, "ema."), str(path))
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        optimizer_state = unflatten_optimizer(split_prefix(tensors, "optim."), meta["optimizer"], params, str(path))
        try:
            self.optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{path}: its optimizer state does not fit this run ({err})") from None
        progress = Progress(meta["epoch"], meta["best_acc"], meta["best_epoch"], meta["last_acc"],
                            meta.get("best_val_acc"))
        self.load_schedule(meta.get("schedule"), progress.start_epoch)
        on_main_process(self.is_main, lambda: self.repair_model_files(progress),
                        f"the main process could not repair the model files of {self.run_dir}")
        return progress

    def load_schedule(self, state: dict | None, start_epoch: int) -> None:
        """Continue the schedule; checkpoints without its state (older versions) used the papers' schedules,
        which are a function of the step count."""
        if state is None and self.cfg.schedule.name in BUILTIN_SCHEDULES:
            state = {"last_epoch": start_epoch * self.schedule.steps_per_epoch}
        if state is None:
            raise CheckpointError(f"cannot resume: {self.run_dir / 'checkpoint.safetensors'} holds no state of "
                                  f"schedule '{self.cfg.schedule.name}'")
        check_schedule_length(self.cfg, self.schedule, state)
        self.schedule.load_state_dict(state)

    def repair_model_files(self, progress: Progress) -> None:
        """Make ``model.safetensors`` and ``best.safetensors`` match the checkpoint: a crash between their
        writes (runs of older versions) or a damaged file is re-derived from the checkpoint where the
        checkpoint holds that epoch's weights, else the resume stops."""
        epoch, files = progress.start_epoch, self.run_files
        for name, wanted in (("model.safetensors", epoch), ("best.safetensors", progress.best_epoch)):
            if wanted == 0 or (name not in files.damaged and files.file_epoch(name) == wanted):
                continue
            if wanted != epoch:
                raise CheckpointError(
                    f"cannot resume: {self.run_dir / name} should hold epoch {wanted} but is missing or damaged "
                    f"(it holds epoch {files.file_epoch(name)}), and the checkpoint (epoch {epoch}) cannot restore it"
                )
            meta = model_meta(self.cfg, self.train_set, epoch=epoch, test_acc=progress.last_acc)
            files.replace_file(name, *model_file(self.inference_model(), meta, self.extra_heads()))
