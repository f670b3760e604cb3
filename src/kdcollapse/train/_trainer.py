"""The training loop behind ``kdcollapse train`` and ``kdcollapse distill``.

One loop serves every method: the method computes its losses (``forward``) and fills gradients
(``backward``); the trainer owns data, schedule, precision, DDP, evaluation and logging, and commits the
files of its :class:`~kdcollapse.train._checkpointer.Checkpointer` through the run lifecycle it shares with
the LM trainer (:class:`~kdcollapse.train._engine.RunEngine`). It reads top to bottom: the ``setup_*`` steps
in the order they run, then :meth:`Trainer.train` (epochs), ``train_epoch`` (batches), ``step`` (one batch),
and evaluation.

Exact resume: the data order, the augmentation and the global RNGs are reseeded at every epoch start
from ``(seed, epoch, rank)``, so an epoch is a pure function of the weights, optimizer state and method
state at its start — exactly what the checkpoint written at the end of the previous epoch holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel

from kdcollapse.config import RunConfig
from kdcollapse.analysis import epoch_collapse_metrics
from kdcollapse.data import USER_DATA, Augment, make_loader
from kdcollapse.distributed import (all_reduce_sum, autocast, init_distributed, resolve_device,
                                    resolve_precision)
from kdcollapse.errors import ConfigError
from kdcollapse.methods import FrozenTeacher, build_method, check_stored_logits, get_method, store_logits
from kdcollapse.models import create_model
from kdcollapse.runs import UserData, load_teacher, on_main_process, run_splits
from kdcollapse.train._checkpointer import Checkpointer, Progress
from kdcollapse.train._checks import TrainerChecks
from kdcollapse.train._engine import RunEngine, TrainingDiverged  # noqa: F401 (TrainingDiverged: its face)
from kdcollapse.train._console import log_epoch, logger
from kdcollapse.train._optim import build_optimizer, build_schedule, build_weight_average, schedule_steps_per


@dataclass
class RunResult:
    run_dir: Path
    best_acc: float  # test accuracy (%) of the selected ("best") epoch
    best_epoch: int  # 1-based
    last_acc: float  # test accuracy (%) after the last epoch
    epochs: int
    best_val_acc: float | None = None  # validation accuracy (%) of the best epoch, if the run has a val split
    selected_on: str = "test"  # the split whose accuracy chose the best epoch: "val", or "test" without one


def select_best(record: dict, best_acc: float, best_val_acc: float | None) -> tuple[str, bool]:
    """Which split chooses "best" and whether this evaluated epoch beats the best so far.

    Validation accuracy when the run has a validation split (``val_acc`` in the record), else test
    accuracy — kept for runs without one, but a choice made on the test set is not a validated one.
    """
    if "val_acc" in record:
        return "val", record["val_acc"] > (best_val_acc if best_val_acc is not None else 0.0)
    return "test", record["test_acc"] > best_acc


def fit(cfg: RunConfig, *, resume: bool = False, overwrite: bool = False, train_data=None, test_data=None,
        val_data=None) -> RunResult:
    """Train ``cfg.method`` on ``cfg.data`` into ``cfg.run_dir``; continue it when ``resume``.

    ``train_data`` and ``test_data`` (and optionally ``val_data``): the run's splits instead of the dataset
    ``data.name`` — torch ``Dataset``s or ``DataLoader``s (read once by ``kdcollapse.data.from_torch``) or
    kdcollapse datasets. ``data.name`` is then saved as ``"user"`` and ``run.json`` records the data's
    fingerprint; a resume needs the same data again (see docs/data.md).
    """
    user = UserData.of(train_data, test_data, val_data)
    if user is not None:
        cfg = dataclasses.replace(cfg, data=dataclasses.replace(cfg.data, name=USER_DATA, root=None))
    return Trainer(cfg, resume=resume, overwrite=overwrite, user_data=user).run()


def seed_everything(seed: int, epoch: int | None = None, rank: int = 0) -> None:
    """Seed python, numpy and torch from (seed, epoch, rank); ``epoch=None`` seeds the initial weights."""
    key = [seed, 0] if epoch is None else [seed, 1, epoch, rank]
    value = int(np.random.SeedSequence(key).generate_state(1)[0])
    random.seed(value)
    np.random.seed(value)
    torch.manual_seed(value)


class Trainer(RunEngine, TrainerChecks):
    """One run: ``Trainer(cfg)`` sets everything up (the ``setup_*`` steps, in this order), ``run()`` trains.

    Nothing in the run directory changes until every setup step worked, so an ``--overwrite`` with a bad
    config, data or teacher leaves the old run as it was (the lifecycle: :class:`RunEngine`).
    """

    def __init__(self, cfg: RunConfig, *, resume: bool = False, overwrite: bool = False,
                 user_data: UserData | None = None):
        self.user_data = user_data
        super().__init__(cfg, resume=resume, overwrite=overwrite)

    def setup(self, resume: bool) -> int:
        """The ``setup_*`` steps after the claim, and on resume the restore; returns the first epoch to train."""
        cfg = self.cfg
        self.setup_data()
        seed_everything(cfg.seed)  # initial weights: a function of the seed, equal on every rank
        self.teacher = self.setup_teacher()
        self.method = self.setup_method()
        self.ema = self.setup_weight_average()
        self.setup_compile()
        self.optimizer, self.schedule = self.setup_optimizer()
        if not resume:
            self.check_first_batch()
        self.checkpointer = Checkpointer(cfg, self.run_files, self.dist.is_main, self.method, self.optimizer,
                                         self.schedule, self.ema, self.inference_model, self.train_set,
                                         has_val=self.val_set is not None)
        self.progress = self.checkpointer.resume(self.device) if resume else Progress()
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype is torch.float16)
        self.model = self.setup_ddp()
        return self.progress.start_epoch

    @property
    def tensorboard(self) -> bool:
        return self.cfg.train.tensorboard

    # ----------------------------------------------------------------------------------- setup
    def setup_environment(self) -> None:
        """Process group, device, determinism and autocast precision; a precision that cannot be honoured
        is an error before the run directory is touched."""
        cfg = self.cfg
        self.dist = init_distributed("cuda" if "cuda" in cfg.train.device or (
            cfg.train.device == "auto" and torch.cuda.is_available()) else "cpu")
        self.device = resolve_device(cfg.train.device, self.dist.local_rank, option="train.device")
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=False)
            torch.backends.cudnn.benchmark = False
        self.amp_dtype = resolve_precision(cfg.train.amp, self.device, option="train.amp")

    def setup_data(self) -> None:
        """The run's splits (``run_splits``) and their loaders: the training loader shuffles and augments as a
        function of (seed, epoch, rank); evaluation runs on the main process over whole splits, unaugmented."""
        d = self.cfg.data
        if self.user_data is not None and self.run_files.resume:
            on_main_process(self.dist.is_main, lambda: self.user_data.check_run(self.run_dir),
                            f"the main process found other data than {self.run_dir} was trained on")
        train_set, self.val_set, test_set = run_splits(self.cfg, self.user_data)
        expected = self.cfg.model.num_classes
        if expected is not None and expected != train_set.num_classes:
            raise ConfigError(
                f"model.num_classes={expected} does not match dataset '{d.name}', which has "
                f"{train_set.num_classes} classes; remove model.num_classes or choose another dataset"
            )
        self.train_set, self.test_set = train_set, test_set
        common = dict(device=self.device, num_workers=d.num_workers)
        self.train_loader = make_loader(
            train_set, d.batch_size, train=True, seed=self.cfg.seed,
            augment=Augment(crop_padding=d.crop_padding, flip=d.flip), rank=self.dist.rank,
            world_size=self.dist.world_size, views=get_method(self.cfg.method.name).views,
            strong_views=get_method(self.cfg.method.name).strong_views, **common,
        )
        self.test_loader = make_loader(test_set, d.eval_batch_size, train=False, seed=0, **common)
        self.val_loader = None if self.val_set is None else make_loader(
            self.val_set, d.eval_batch_size, train=False, seed=0, **common)

    def setup_teacher(self) -> FrozenTeacher | None:
        """The teacher the method's ``teacher_request`` asks for: online, or its logits stored once when
        ``teacher.cache=logits`` and the request allows it; ``None`` for a method without one. Built before
        the student, whose initial weights follow it in the random stream."""
        cfg = self.cfg
        method_cls = get_method(cfg.method.name)
        request = method_cls.teacher_request(cfg.method)
        if request is None:
            if cfg.teacher.checkpoint or cfg.teacher.weights:
                raise ConfigError(f"method '{cfg.method.name}' does not use a teacher; remove the teacher section")
            return None
        teacher = load_teacher(cfg.teacher, self.train_set).to(self.device)
        if self.channels_last():
            teacher.to(memory_format=torch.channels_last)
        if cfg.teacher.cache != "logits":
            return teacher
        check_stored_logits(cfg.method.name, request, cfg.data, self.train_set, views=method_cls.views,
                            topk=cfg.teacher.cache_topk)
        # One pass over the unaugmented training images, in the run's precision and layout.
        loader = make_loader(self.train_set, cfg.data.eval_batch_size, train=False, seed=0, device=self.device,
                             num_workers=cfg.data.num_workers)
        return store_logits(teacher, loader, request, num_classes=self.train_set.num_classes,
                            topk=cfg.teacher.cache_topk, prepare=self.to_layout, precision=self.precision)

    def setup_method(self):
        """The student and the method around it, on the device and in the run's layout."""
        cfg, data = self.cfg, self.train_set
        student = create_model(cfg.model.name, data.num_classes, in_channels=data.in_channels,
                               input_shape=data.input_shape, **cfg.model.kwargs)
        method = build_method(cfg.method, student, num_classes=data.num_classes, teacher=self.teacher,
                              label_smoothing=cfg.train.label_smoothing, train_labels=data.labels).to(self.device)
        method.set_input_normalization(data.mean, data.std)
        if self.channels_last():
            method.to(memory_format=torch.channels_last)
        if cfg.optim.accumulate > 1 and not method.sums_batch_gradients:
            raise ConfigError(f"optim.accumulate={cfg.optim.accumulate}: method '{cfg.method.name}' with "
                              "these settings does not train on the sum of its batches' gradients (see "
                              "docs/training.md); set optim.accumulate=1")
        return method

    def setup_weight_average(self):
        """The average of the student's weights that ``train.ema`` asks for (``None`` without it)."""
        ema = build_weight_average(self.cfg, self.method.student)
        if ema is not None and self.method.inference_model() is not self.method.student:
            raise ConfigError(f"method '{self.cfg.method.name}' keeps its own weight average (method.ema_decay); "
                              "set train.ema=0")
        return ema

    def setup_compile(self) -> None:
        """``train.compile``: the student's training graph (evaluation runs it eagerly, see ``eager``)."""
        if not self.cfg.train.compile:
            return
        if self.device.type == "cpu":
            logger.warning("train.compile on the CPU: in the measurements of docs/training.md (Speed) a compiled "
                           "step was no faster than the eager channels-last one, and compiling costs seconds to "
                           "minutes; set train.compile=false unless your own timing says otherwise")
        self.method.student.compile()

    def setup_optimizer(self):
        """The optimizer over the method's parameter groups and its learning-rate schedule."""
        optimizer = build_optimizer(self.cfg, self.method.optimizer_groups())
        return optimizer, build_schedule(self.cfg, optimizer, len(self.train_loader))

    def setup_ddp(self):
        """The method itself, or wrapped in DDP under ``torchrun``."""
        if not self.dist.enabled:
            return self.method
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(self.method, device_ids=ids)

    def execution(self) -> dict:
        """What actually runs, for run.json: autocast precision, memory layout, compiled or not."""
        return {
            "precision": {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.amp_dtype],
            "memory_format": "channels_last" if self.channels_last() else "contiguous",
            "compiled": self.cfg.train.compile, "device": str(self.device),
            "teacher": None if self.teacher is None else self.teacher.describe(),
            **({"user_data": self.user_data.fingerprint} if self.user_data is not None else {}),
        }  # fmt: skip

    # ------------------------------------------------------------------------- helpers of both
    def channels_last(self) -> bool:
        """Whether inputs, student and teacher use the channels-last layout (images only)."""
        return self.cfg.train.channels_last and len(self.train_set.input_shape) == 3

    def to_layout(self, x: torch.Tensor) -> torch.Tensor:
        """A batch in the run's memory layout (``(B, V, C, H, W)`` multi-view batches stay as they are)."""
        if self.channels_last() and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def precision(self):
        """The autocast context of the run's precision (``train.amp``)."""
        return autocast(self.device, self.amp_dtype)

    def inference_model(self) -> torch.nn.Module:
        """The network evaluated and saved as the run's model: the weight average when ``train.ema`` is on."""
        return self.method.inference_model() if self.ema is None else self.ema.module

    def eager(self):
        """Evaluation runs a compiled student eagerly: compiling its eval-mode graph as well costs more than
        the evaluation passes save (``benchmarks/bench_compile.py``)."""
        return torch.compiler.set_stance("force_eager") if self.cfg.train.compile else contextlib.nullcontext()

    # ------------------------------------------------------------------------------------ loop
    def train(self) -> RunResult:
        """Every remaining epoch: train, evaluate, choose the best, check, log and commit."""
        cfg, progress = self.cfg, self.progress
        for epoch in range(progress.start_epoch, cfg.train.epochs):
            seed_everything(cfg.seed, epoch, self.dist.rank)
            self.train_loader.set_epoch(epoch)
            self.method.on_epoch_start(epoch)
            record = {"epoch": epoch + 1} | self.train_epoch(epoch)
            self.method.on_epoch_end(epoch)
            record |= self.method.epoch_metrics()
            last = epoch + 1 == cfg.train.epochs
            improved = False
            if self.dist.is_main and (last or (epoch + 1) % cfg.train.eval_every == 0):
                record |= self.evaluate()
                progress.last_acc, progress.last_val_acc = record["test_acc"], record.get("val_acc")
                record["selected_on"], improved = select_best(record, progress.best_acc, progress.best_val_acc)
                if improved:
                    progress.best_acc, progress.best_val_acc = progress.last_acc, progress.last_val_acc
                    progress.best_epoch = epoch + 1
            record |= self.collapse_metrics(epoch)
            if self.dist.enabled:
                record["ranks_in_sync"] = self.ranks_in_sync()
            self.check_epoch_is_good(epoch, record)
            self.log.write(record)
            self.commit(epoch + 1, lambda: self.checkpointer.epoch_files(epoch + 1, progress, improved))
            if self.dist.is_main:
                log_epoch(record, cfg.train.epochs)
        return RunResult(self.run_dir, progress.best_acc, progress.best_epoch, progress.last_acc, cfg.train.epochs,
                         progress.best_val_acc, "test" if self.val_set is None else "val")

    def train_epoch(self, epoch: int) -> dict:
        """One pass over this process's share of the training set: the epoch's ``train_*`` record."""
        cfg, method, loader = self.cfg, self.method, self.train_loader
        method.train()
        steps = len(loader)
        sums: dict[str, torch.Tensor] = {}
        correct = torch.zeros((), device=self.device, dtype=torch.float64)
        seen = 0
        check_every = 1 if self.device.type == "cpu" else 25  # NaN checks cost a host sync on GPU
        bar = self.progress_bar(cfg.train.progress, iterable=loader, total=steps,
                                desc=f"epoch {epoch + 1}/{cfg.train.epochs}")
        start = time.perf_counter()
        k = cfg.optim.accumulate
        first_step = epoch * -(-steps // k)  # optimizer steps before this epoch
        for i, (x, y) in enumerate(bar):
            index = loader.batch_index(i)
            if self.teacher is not None:
                self.teacher.select(index)  # stored logits read their rows; an online teacher ignores it
            lr = self.optimizer.param_groups[0]["lr"]
            out = self.step(self.to_layout(x), y, i, steps, index if method.needs_index else None)
            for name, value in out.items():
                if name != "logits" and value.dim() == 0:
                    sums[name] = sums.get(name, 0) + value.detach().float()
            correct += (out["logits"].argmax(1) == y).sum()
            seen += y.numel()
            if (i + 1) % check_every == 0 or i + 1 == steps:
                self.check_finite(sums["loss"], epoch, i)
            self.log_step(out["loss"], lr, epoch, i, steps, first_step)
            if cfg.train.progress and self.dist.is_main and (i % 10 == 0 or i + 1 == steps):
                elapsed = time.perf_counter() - start
                bar.set_postfix(loss=f"{sums['loss'].item() / (i + 1):.3f}",
                                acc=f"{100 * correct.item() / seen:.1f}", img_s=f"{seen / elapsed:.0f}")
        elapsed = time.perf_counter() - start
        if schedule_steps_per(cfg) == "epoch":
            self.schedule.step()
        stats = torch.stack([*sums.values(), correct, torch.tensor(float(seen), device=self.device)])
        stats = all_reduce_sum(stats.double()) / torch.tensor(
            [self.dist.world_size] * len(sums) + [1, 1], device=self.device, dtype=torch.float64
        )
        totals = stats.tolist()
        record = {f"train_{k}": v / steps for k, v in zip(sums, totals)}
        record |= {"train_acc": 100 * totals[-2] / totals[-1], "lr": lr,
                   "images_per_s": totals[-1] / elapsed, "epoch_time_s": elapsed}
        return record

    def log_step(self, loss: torch.Tensor, lr: float, epoch: int, batch: int, batches: int, first_step: int) -> None:
        """After the last batch of an optimizer step: every ``train.log_every`` steps (and at the epoch's end)
        the step's scalars (its batches' mean loss on the main process, the learning rate) go to
        :meth:`MetricsLog.write_step`, committed in ``steps.jsonl`` with the epoch and then sent to TensorBoard
        and the trackers, as a language-model run's steps are."""
        k = self.cfg.optim.accumulate
        loss = loss.detach()
        self._step_loss = loss if batch % k == 0 else self._step_loss + loss  # no host sync until it is written
        if (batch + 1) % k and batch + 1 != batches:
            return
        step = first_step + batch // k + 1
        if self.log.enabled and (step % self.cfg.train.log_every == 0 or batch + 1 == batches):
            self.log.write_step({"step": step, "epoch": epoch + 1,
                                 "train_loss": float(self._step_loss) / (batch % k + 1), "lr": lr})

    def step(self, x: torch.Tensor, y: torch.Tensor, batch: int = 0, batches: int = 1,
             index: torch.Tensor | None = None) -> dict[str, torch.Tensor]:
        """Forward and backward of batch ``batch`` of ``batches`` (with its dataset ``index`` for a method that
        declares ``needs_index``); an optimizer step after every ``optim.accumulate`` batches (and after the
        epoch's last), on the gradient of their samples' mean loss."""
        k, start = self.cfg.optim.accumulate, batch - batch % self.cfg.optim.accumulate
        group = min(k, batches - start)  # batches summed into this optimizer step
        first, last = batch == start, batch == start + group - 1
        defer = self.method.manual_gradient_sync or not last  # no all-reduce by DDP in this backward
        sync = self.model.no_sync() if defer and self.dist.enabled else contextlib.nullcontext()
        # Each batch's mean loss weighted by its share of the step's samples: the step's mean (a short last
        # batch weighs less). 1 without accumulation.
        loader = self.train_loader
        weight = len(y) / min(k * loader.batch_size, loader.num_samples - start * loader.batch_size)
        scale = self.scaler.scale if weight == 1 else (lambda loss: self.scaler.scale(loss * weight))
        with sync:
            with self.precision():
                out = self.model(x, y) if index is None else self.model(x, y, index=index)
            if first:
                self.optimizer.zero_grad(set_to_none=True)
            self.method.backward(out, scale)
        if last:
            self.optimizer_step()
        return out

    def optimizer_step(self) -> None:
        if self.cfg.optim.grad_clip is not None:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.method.parameters(), self.cfg.optim.grad_clip)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        self.method.after_step()
        if self.ema is not None:
            self.ema.update_parameters(self.method.student)
        if schedule_steps_per(self.cfg) == "step":
            self.schedule.step()

    # -------------------------------------------------------------------------- evaluation
    @torch.no_grad()
    def evaluate(self) -> dict:
        """``test_acc``/``test_loss``, and ``val_acc``/``val_loss`` when the run has a validation split."""
        with self.eager():
            record = self.evaluate_split(self.test_loader, "test")
            if self.val_loader is not None:
                record |= self.evaluate_split(self.val_loader, "val")
        return record

    def predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.predict(x) if self.ema is None else self.ema.module(x)

    @torch.no_grad()
    def evaluate_split(self, loader, split: str) -> dict:
        self.method.eval()
        correct = torch.zeros((), device=self.device, dtype=torch.float64)
        loss = torch.zeros((), device=self.device, dtype=torch.float64)
        for x, y in loader:
            with self.precision():
                logits = self.predict(self.to_layout(x)).float()
            loss += torch.nn.functional.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
        self.method.train()
        n = len(loader.dataset)
        return {f"{split}_acc": 100 * correct.item() / n, f"{split}_loss": loss.item() / n}

    def collapse_metrics(self, epoch: int) -> dict:
        """Collapse metrics of train and test features every ``analysis.every`` epochs, on the main process
        (see ``kdcollapse.analysis.epoch_collapse_metrics``)."""
        if not self.dist.is_main:
            return {}
        with self.eager():
            return epoch_collapse_metrics(self.cfg, epoch, self.method.student, self.train_set, self.test_set)
