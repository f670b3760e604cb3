"""The optimizer, the learning-rate schedule and the weight average of a run, built from its config.

* ``optim.name``: ``sgd`` (the papers' optimizer: momentum, Nesterov, weight decay), ``adamw``, or any
  ``torch.optim`` optimizer, with ``optim.kwargs`` passed on (``betas``, ``eps``, ...).
* ``schedule.name``: the papers' schedules ``multistep``, ``cosine`` and ``constant`` with linear warm-up,
  evaluated at the fractional epoch of every optimizer step (:class:`PaperSchedule`); or any
  ``torch.optim.lr_scheduler`` schedule, stepped per epoch or per optimizer step (``schedule.interval``).
* ``train.ema``: an exponential moving average of the student's weights and buffers,
  ``torch.optim.swa_utils.AveragedModel``, updated after every optimizer step.

All three are ``torch`` objects with ``state_dict``/``load_state_dict``, so a checkpoint holds them and a
resumed run continues them exactly.
"""

from __future__ import annotations

import copy
import inspect
import json
import math

import torch
from torch import nn
from torch.optim.lr_scheduler import LRScheduler
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from kdcollapse.config import RunConfig, torch_class
from kdcollapse.errors import ConfigError

BUILTIN_SCHEDULES = ("multistep", "cosine", "constant")
LENGTH_ARGUMENTS = ("T_max", "total_iters", "total_steps")  # a torch schedule's length, given the run's


def learning_rate(cfg: RunConfig, epoch_progress: float) -> float:
    """Learning rate at a (fractional) epoch: linear warm-up, then multi-step or cosine decay."""
    lr, sched, epochs = cfg.optim.lr, cfg.schedule, cfg.train.epochs
    if epoch_progress < sched.warmup_epochs:
        return lr * epoch_progress / sched.warmup_epochs
    if sched.name == "multistep":
        return lr * sched.gamma ** sum(epoch_progress >= m for m in sched.milestones)
    if sched.name == "cosine":
        t = (epoch_progress - sched.warmup_epochs) / max(epochs - sched.warmup_epochs, 1e-12)
        return sched.min_lr + (lr - sched.min_lr) * 0.5 * (1 + math.cos(math.pi * min(t, 1.0)))
    return lr


def build_optimizer(cfg: RunConfig, params: list[nn.Parameter] | list[dict]) -> torch.optim.Optimizer:
    """``cfg.optim`` as a torch optimizer over ``params`` or parameter groups (``Method.optimizer_groups``:
    a group's ``lr_scale`` multiplies ``optim.lr``, its other keys override the config's); bad
    ``optim.kwargs`` are a :class:`ConfigError`."""
    o = cfg.optim
    cls = torch_class("optimizer", o.name)
    args = dict(lr=o.lr, weight_decay=o.weight_decay)
    if cls is torch.optim.SGD:
        args |= dict(momentum=o.momentum, nesterov=o.nesterov)
    if params and isinstance(params[0], dict):
        params = [{**group, "lr": o.lr * group["lr_scale"]} if "lr_scale" in group else group for group in params]
    return _construct(cls, "optim.kwargs", params, args | o.kwargs)


def steps_per_epoch(cfg: RunConfig, batches: int) -> int:
    """Optimizer steps in an epoch of ``batches`` batches: one per ``optim.accumulate`` batches, and one for
    a shorter group at the epoch's end."""
    return math.ceil(batches / cfg.optim.accumulate)


def build_schedule(cfg: RunConfig, optimizer: torch.optim.Optimizer, batches: int) -> LRScheduler:
    """``cfg.schedule`` for ``optimizer``; call ``step()`` as :func:`schedule_steps_per` says."""
    per_epoch = steps_per_epoch(cfg, batches)
    if cfg.schedule.name in BUILTIN_SCHEDULES:
        return PaperSchedule(optimizer, cfg, per_epoch)
    cls = torch_class("scheduler", cfg.schedule.name)
    length = cfg.train.epochs * (per_epoch if cfg.schedule.interval == "step" else 1)
    defaults = {**dict.fromkeys(LENGTH_ARGUMENTS, length), "max_lr": cfg.optim.lr}
    accepted = inspect.signature(cls).parameters
    filled = {k: v for k, v in defaults.items() if k in accepted and k not in cfg.schedule.kwargs}
    schedule = _construct(cls, "schedule.kwargs", optimizer, filled | cfg.schedule.kwargs)
    # Recorded with its state: a resume with another train.epochs would keep the old length (see
    # check_schedule_length).
    schedule.run_length = length if filled.keys() & set(LENGTH_ARGUMENTS) else None
    try:
        json.dumps(schedule.state_dict())
    except TypeError:
        raise ConfigError(f"schedule.name={cfg.schedule.name}: its state cannot be saved in a checkpoint; "
                          f"choose another schedule") from None
    return schedule


def schedule_steps_per(cfg: RunConfig) -> str:
    """When the trainer calls ``schedule.step()``: after every ``"step"`` or every ``"epoch"``."""
    return "step" if cfg.schedule.name in BUILTIN_SCHEDULES else cfg.schedule.interval


def check_schedule_length(cfg: RunConfig, schedule: LRScheduler, state: dict) -> None:
    """Refuse to resume a torch schedule whose length was the run's with a run of another length: its saved
    state keeps the old length (OneCycleLR would stop, CosineAnnealingLR would rise again)."""
    built_for, now = state.get("run_length"), getattr(schedule, "run_length", None)
    if built_for is not None and built_for != now:
        unit = "steps" if cfg.schedule.interval == "step" else "epochs"
        raise ConfigError(f"cannot resume with train.epochs={cfg.train.epochs}: schedule {cfg.schedule.name} was "
                          f"built for a run of {built_for} {unit} ({now} now) and keeps that length; resume with "
                          f"the run's train.epochs={built_for // (now // cfg.train.epochs)}")


class PaperSchedule(LRScheduler):
    """The papers' schedules (:func:`learning_rate`) as a torch schedule stepped after every optimizer step:
    step ``s`` of an epoch of ``n`` steps trains at ``learning_rate(cfg, epoch + s / n)``."""

    def __init__(self, optimizer: torch.optim.Optimizer, cfg: RunConfig, steps_per_epoch: int):
        self.cfg, self.steps_per_epoch = copy.deepcopy(cfg), steps_per_epoch
        super().__init__(optimizer)

    def get_lr(self) -> list[float]:
        epoch, step = divmod(self.last_epoch, self.steps_per_epoch)
        lr = learning_rate(self.cfg, epoch + step / self.steps_per_epoch)
        return [lr * group.get("lr_scale", 1.0) for group in self.optimizer.param_groups]

    def state_dict(self) -> dict:
        return {k: v for k, v in super().state_dict().items() if k != "cfg"}


def build_weight_average(cfg: RunConfig, model: nn.Module) -> AveragedModel | None:
    """An exponential moving average of ``model``'s parameters and buffers with decay ``train.ema``
    (``None`` when it is 0); its first update copies the model."""
    if cfg.train.ema == 0:
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(cfg.train.ema), use_buffers=True).eval()


def _construct(cls: type, key: str, first, kwargs: dict):
    try:
        return cls(first, **kwargs)
    except (TypeError, ValueError, KeyError) as err:
        params = [p for p in inspect.signature(cls).parameters if p not in ("self", "params", "optimizer")]
        raise ConfigError(f"{key}: {cls.__name__} does not accept {kwargs} ({err}); its arguments are "
                          f"{', '.join(params)}") from None
