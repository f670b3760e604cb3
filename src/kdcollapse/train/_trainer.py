"""The training loop behind ``kdcollapse train`` and ``kdcollapse distill``.

One loop serves every method: the method computes its losses (``forward``) and fills gradients
(``backward``); the trainer owns data, schedule, precision, DDP, evaluation, logging and checkpoints.

Exact resume: the data order, the augmentation and the global RNGs are reseeded at every epoch start
from ``(seed, epoch, rank)``, so an epoch is a pure function of the weights, optimizer state and method
state at its start — exactly what the checkpoint written at the end of the previous epoch holds.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn.parallel import DistributedDataParallel
from tqdm import tqdm

from kdcollapse.config import RunConfig
from kdcollapse.analysis import epoch_collapse_metrics
from kdcollapse.data import USER_DATA, Augment, make_loader
from kdcollapse.distributed import (all_ranks_ok, all_reduce_sum, autocast, init_distributed, resolve_device,
                                    resolve_precision)
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.methods import build_method, get_method
from kdcollapse.models import create_model
from kdcollapse.runs import (MetricsLog, TeacherLogitCache, UserData, check_teacher_cache, claim_run_dir, load_teacher,
                             run_splits, start_run_dir, top_logits, update_run_record)
from kdcollapse.runs import _checkpoint as ckpt
from kdcollapse.runs._run_dir import on_main_process
from kdcollapse.train._console import log_epoch, logger
from kdcollapse.train._optim import (BUILTIN_SCHEDULES, build_optimizer, build_schedule, build_weight_average,
                                     check_schedule_length, schedule_steps_per)


class TrainingDiverged(KdcollapseError):
    """The loss, the weights or the evaluation became NaN or infinite."""


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


class Trainer:
    def __init__(self, cfg: RunConfig, *, resume: bool = False, overwrite: bool = False,
                 user_data: UserData | None = None):
        self.run_files, self.user_data = None, user_data
        try:
            self._setup(cfg, resume, overwrite)
        except BaseException:
            self._release_run_dir()
            raise

    def _release_run_dir(self) -> None:
        if self.run_files is not None:
            self.run_files.release()

    def _setup(self, cfg: RunConfig, resume: bool, overwrite: bool) -> None:
        """Claim the run directory, build and check everything, and only then change the directory (so an
        ``--overwrite`` with a bad config, data or teacher leaves the old run as it was)."""
        self.cfg = cfg
        self.dist = init_distributed("cuda" if "cuda" in cfg.train.device or (
            cfg.train.device == "auto" and torch.cuda.is_available()) else "cpu")
        self.device = resolve_device(cfg.train.device, self.dist.local_rank, option="train.device")
        if cfg.train.deterministic:
            torch.use_deterministic_algorithms(True, warn_only=False)
            torch.backends.cudnn.benchmark = False
        # Checked before the run directory is touched: a precision that cannot be honoured is an error.
        self.amp_dtype = resolve_precision(cfg.train.amp, self.device, option="train.amp")
        self.run_dir = Path(cfg.run_dir)
        self.run_files = claim_run_dir(cfg, resume=resume, overwrite=overwrite, is_main=self.dist.is_main)
        self._build_data()
        seed_everything(cfg.seed)  # initial weights: a function of the seed, equal on every rank
        self._build_method()
        self.optimizer = build_optimizer(cfg, [p for p in self.method.parameters() if p.requires_grad])
        self.schedule = build_schedule(cfg, self.optimizer, len(self.train_loader))
        self.start_epoch, self.best_acc, self.best_epoch, self.last_acc = 0, 0.0, 0, float("nan")
        self.best_val_acc, self.last_val_acc = None, None
        if resume:
            self._load_checkpoint()
        start_run_dir(cfg, self.run_files)
        self.log = MetricsLog(self.run_dir, start_epoch=self.start_epoch, enabled=self.dist.is_main,
                              tensorboard=cfg.train.tensorboard)
        self.scaler = torch.amp.GradScaler("cuda", enabled=self.amp_dtype is torch.float16)
        self.model = self._wrap_ddp()
        self._record_execution()

    # ----------------------------------------------------------------------------------- setup
    def _build_data(self) -> None:
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
            world_size=self.dist.world_size, views=get_method(self.cfg.method.name).views, **common,
        )
        # Evaluation runs on the main process only, over the whole test (and validation) set, unaugmented.
        self.test_loader = make_loader(test_set, d.eval_batch_size, train=False, seed=0, **common)
        self.val_loader = None if self.val_set is None else make_loader(
            self.val_set, d.eval_batch_size, train=False, seed=0, **common)

    def _build_method(self) -> None:
        cfg = self.cfg
        method_cls = get_method(cfg.method.name)
        teacher = self.teacher_cache = None
        if method_cls.needs_teacher:
            teacher = load_teacher(cfg.teacher, self.train_set).to(self.device)
            if self._channels_last():
                teacher.to(memory_format=torch.channels_last)
            if cfg.teacher.cache == "logits":
                check_teacher_cache(cfg.method.name, method_cls, cfg.data, self.train_set, cfg.teacher.cache_topk)
                teacher = self.teacher_cache = self._cache_teacher_logits(teacher)
        elif cfg.teacher.checkpoint or cfg.teacher.weights:
            raise ConfigError(f"method '{cfg.method.name}' does not use a teacher; remove the teacher section")
        student = create_model(cfg.model.name, self.train_set.num_classes, in_channels=self.train_set.in_channels,
                               **cfg.model.kwargs)
        self.method = build_method(cfg.method, student, num_classes=self.train_set.num_classes, teacher=teacher,
                                   label_smoothing=cfg.train.label_smoothing).to(self.device)
        self.method.set_input_normalization(self.train_set.mean, self.train_set.std)
        if self._channels_last():
            self.method.to(memory_format=torch.channels_last)
        self._check_accumulation()
        self.ema = build_weight_average(cfg, self.method.student)
        if self.ema is not None and self.method.inference_model() is not self.method.student:
            raise ConfigError(f"method '{cfg.method.name}' keeps its own weight average (method.ema_decay); "
                              "set train.ema=0")
        if cfg.train.compile:
            if self.device.type == "cpu":
                logger.warning("train.compile on the CPU: in the measurements of docs/training.md (Speed) a compiled "
                               "step was no faster than the eager channels-last one, and compiling costs seconds to "
                               "minutes; set train.compile=false unless your own timing says otherwise")
            self.method.student.compile()

    def _check_accumulation(self) -> None:
        if self.cfg.optim.accumulate > 1 and not self.method.sums_batch_gradients:
            raise ConfigError(f"optim.accumulate={self.cfg.optim.accumulate}: method '{self.cfg.method.name}' with "
                              "these settings does not train on the sum of its batches' gradients (see "
                              "docs/training.md); set optim.accumulate=1")

    def _inference_model(self) -> torch.nn.Module:
        """The network evaluated and saved as the run's model: the weight average when ``train.ema`` is on."""
        return self.method.inference_model() if self.ema is None else self.ema.module

    def _cache_teacher_logits(self, teacher) -> TeacherLogitCache:
        """One teacher pass over the unaugmented training images, in the run's precision and layout; with
        ``teacher.cache_topk`` each batch is reduced to its top-k logits at once (the full N x K never exists)."""
        loader = make_loader(self.train_set, self.cfg.data.eval_batch_size, train=False, seed=0, device=self.device,
                             num_workers=self.cfg.data.num_workers)
        k, method_config = self.cfg.teacher.cache_topk, self.cfg.method
        keep_all = k is None or k >= self.train_set.num_classes
        rows = []
        for x, _ in loader:
            with self._autocast():
                z = teacher.logits(self._to_layout(x))
            rows.append(z if keep_all else top_logits(z, k, method_config.temperature))
        if keep_all:
            return TeacherLogitCache(teacher, torch.cat(rows))
        top = {key: torch.cat([r[key] for r in rows]) for key in rows[0]}
        return TeacherLogitCache(teacher, top=top, num_classes=self.train_set.num_classes)

    def _select_teacher_rows(self, batch: int) -> None:
        """Tell stored teacher logits which images training batch ``batch`` holds."""
        if self.teacher_cache is not None:
            self.teacher_cache.select(self.train_loader.batch_index(batch))

    def _channels_last(self) -> bool:
        """Whether inputs, student and teacher use the channels-last layout (images only)."""
        return self.cfg.train.channels_last and len(self.train_set.input_shape) == 3

    def _to_layout(self, x: torch.Tensor) -> torch.Tensor:
        """A batch in the run's memory layout (``(B, V, C, H, W)`` multi-view batches stay as they are)."""
        if self._channels_last() and x.dim() == 4:
            return x.contiguous(memory_format=torch.channels_last)
        return x

    def _record_execution(self) -> None:
        """Write what actually runs into run.json: autocast precision, memory layout, compiled or not."""
        if self.dist.is_main:
            update_run_record(self.run_dir, {
                "precision": {None: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}[self.amp_dtype],
                "memory_format": "channels_last" if self._channels_last() else "contiguous",
                "compiled": self.cfg.train.compile, "device": str(self.device),
                "teacher": None if self.method.teacher is None else
                self._stored_logits_record() if self.teacher_cache is not None else "online",
                **({"user_data": self.user_data.fingerprint} if self.user_data is not None else {}),
            })  # fmt: skip

    def _stored_logits_record(self) -> str:
        cache = self.teacher_cache
        return "stored logits" if cache.top is None else \
            f"stored logits (top {cache.top['values'].shape[1]} of {cache.classes})"

    def _wrap_ddp(self):
        if not self.dist.enabled:
            return self.method
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(self.method, device_ids=ids)

    # ---------------------------------------------------------------------------- checkpoints
    def _checkpoint_meta(self, epoch: int) -> dict:
        return {
            "format": "kdcollapse.checkpoint", "version": 1, "epoch": epoch, "seed": self.cfg.seed,
            "model": self.cfg.model.name, "method": self.cfg.method.name, "dataset": self.cfg.data.name,
            "best_acc": self.best_acc, "best_epoch": self.best_epoch, "last_acc": self.last_acc,
            "best_val_acc": self.best_val_acc, "selected_on": "test" if self.val_set is None else "val",
        }

    def _epoch_files(self, epoch: int, improved: bool) -> dict:
        """The weight files of ``epoch``: the checkpoint, the inference model, and the best model if improved."""
        optim_tensors, optim_rest = ckpt.flatten_optimizer(self.optimizer.state_dict())
        tensors = {f"method.{k}": v for k, v in self.method.state_dict().items()}
        tensors |= {f"optim.{k}": v for k, v in optim_tensors.items()}
        tensors |= {f"extra.{k}": v for k, v in self.method.extra_state().items()}
        if self.ema is not None:
            tensors |= {f"ema.{k}": v for k, v in self.ema.state_dict().items()}
        meta = self._checkpoint_meta(epoch) | {"optimizer": optim_rest, "schedule": self.schedule.state_dict()}
        model = ckpt.model_file(self._inference_model(),
                                ckpt.model_meta(self.cfg, self.train_set, epoch=epoch, test_acc=self.last_acc,
                                               val_acc=self.last_val_acc))
        return {"checkpoint.safetensors": (tensors, meta), "model.safetensors": model,
                **({"best.safetensors": model} if improved else {})}

    def _save_checkpoint(self, epoch: int, improved: bool) -> None:
        """Commit ``epoch`` (weights, metrics) in one step; a failure (a full disk) commits nothing."""
        def commit() -> None:
            try:
                self.run_files.commit(epoch, self._epoch_files(epoch, improved), self.log.files())
            except CheckpointError as err:
                raise CheckpointError(f"{err}; nothing of epoch {epoch} was saved and {self.run_dir} still holds "
                                      f"epoch {epoch - 1}: free space and resume it") from None

        on_main_process(self.dist.is_main, commit, f"the main process could not save epoch {epoch}")

    def _load_checkpoint(self) -> None:
        path = self.run_dir / "checkpoint.safetensors"
        tensors, meta = ckpt.load_tensors(path, device=self.device)
        ckpt.check_checkpoint_meta(meta, str(path))
        for key in ("model", "method", "dataset"):
            saved, wanted = meta.get(key), getattr(self.cfg, "data" if key == "dataset" else key).name
            if saved != wanted:
                raise KdcollapseError(
                    f"cannot resume: the checkpoint in {self.run_dir} is for {key} '{saved}', the config asks "
                    f"for '{wanted}'"
                )
        ckpt.load_state(self.method, ckpt.split_prefix(tensors, "method."), str(path))
        self.method.load_extra_state(ckpt.split_prefix(tensors, "extra."))
        if self.ema is not None:
            ckpt.load_state(self.ema, ckpt.split_prefix(tensors, "ema."), str(path))
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        optimizer_state = ckpt.unflatten_optimizer(ckpt.split_prefix(tensors, "optim."), meta["optimizer"], params,
                                                   str(path))
        try:
            self.optimizer.load_state_dict(optimizer_state)
        except (ValueError, KeyError, TypeError) as err:
            raise CheckpointError(f"{path}: its optimizer state does not fit this run ({err})") from None
        self.start_epoch = meta["epoch"]
        self._load_schedule(meta.get("schedule"))
        self.best_acc, self.best_epoch, self.last_acc = meta["best_acc"], meta["best_epoch"], meta["last_acc"]
        self.best_val_acc = meta.get("best_val_acc")
        on_main_process(self.dist.is_main, self._repair_model_files,
                        f"the main process could not repair the model files of {self.run_dir}")

    def _load_schedule(self, state: dict | None) -> None:
        """Continue the schedule; checkpoints without its state (older versions) used the papers' schedules,
        which are a function of the step count."""
        if state is None and self.cfg.schedule.name in BUILTIN_SCHEDULES:
            state = {"last_epoch": self.start_epoch * self.schedule.steps_per_epoch}
        if state is None:
            raise CheckpointError(f"cannot resume: {self.run_dir / 'checkpoint.safetensors'} holds no state of "
                                  f"schedule '{self.cfg.schedule.name}'")
        check_schedule_length(self.cfg, self.schedule, state)
        self.schedule.load_state_dict(state)

    def _repair_model_files(self) -> None:
        """Make ``model.safetensors`` and ``best.safetensors`` match the checkpoint: a crash between their
        writes (runs of older versions) or a damaged file is re-derived from the checkpoint where the
        checkpoint holds that epoch's weights, else the resume stops."""
        epoch, files = self.start_epoch, self.run_files
        for name, wanted in (("model.safetensors", epoch), ("best.safetensors", self.best_epoch)):
            if wanted == 0 or (name not in files.damaged and files.file_epoch(name) == wanted):
                continue
            if wanted != epoch:
                raise CheckpointError(
                    f"cannot resume: {self.run_dir / name} should hold epoch {wanted} but is missing or damaged "
                    f"(it holds epoch {files.file_epoch(name)}), and the checkpoint (epoch {epoch}) cannot restore it"
                )
            meta = ckpt.model_meta(self.cfg, self.train_set, epoch=epoch, test_acc=self.last_acc)
            files.replace_file(name, *ckpt.model_file(self._inference_model(), meta))

    # ---------------------------------------------------------------------------------- loop
    def run(self) -> RunResult:
        try:
            return self._run_epochs()
        finally:
            self._release_run_dir()

    def _run_epochs(self) -> RunResult:
        cfg = self.cfg
        for epoch in range(self.start_epoch, cfg.train.epochs):
            seed_everything(cfg.seed, epoch, self.dist.rank)
            self.train_loader.set_epoch(epoch)
            self.method.on_epoch_start(epoch)
            record = {"epoch": epoch + 1} | self._train_epoch(epoch)
            self.method.on_epoch_end(epoch)
            record |= self.method.epoch_metrics()
            last = epoch + 1 == cfg.train.epochs
            improved = False
            if self.dist.is_main and (last or (epoch + 1) % cfg.train.eval_every == 0):
                record |= self._evaluate()
                self.last_acc, self.last_val_acc = record["test_acc"], record.get("val_acc")
                record["selected_on"], improved = select_best(record, self.best_acc, self.best_val_acc)
                if improved:
                    self.best_acc, self.best_val_acc, self.best_epoch = self.last_acc, self.last_val_acc, epoch + 1
            record |= self._extra_epoch_metrics(epoch)
            if self.dist.enabled:
                record["ranks_in_sync"] = self._ranks_in_sync()
            self._check_epoch_is_good(epoch, record)
            self.log.write(record)
            self._save_checkpoint(epoch + 1, improved)
            if self.dist.is_main:
                log_epoch(record, cfg.train.epochs)
        self.log.close()
        return RunResult(self.run_dir, self.best_acc, self.best_epoch, self.last_acc, cfg.train.epochs,
                         self.best_val_acc, "test" if self.val_set is None else "val")

    @torch.no_grad()
    def _ranks_in_sync(self) -> bool:
        """Whether every process holds the same parameters (DDP keeps them equal; this checks it)."""
        sums = torch.stack([torch.stack([p.double().sum(), p.double().square().sum()])
                            for p in self.method.parameters()]).flatten()
        low, high = sums.clone(), sums.clone()
        torch.distributed.all_reduce(low, op=torch.distributed.ReduceOp.MIN)
        torch.distributed.all_reduce(high, op=torch.distributed.ReduceOp.MAX)
        return bool(torch.equal(low, high))

    def _extra_epoch_metrics(self, epoch: int) -> dict:
        """Collapse metrics of train and test features every ``analysis.every`` epochs, on the main process
        (see ``kdcollapse.analysis.epoch_collapse_metrics``)."""
        if not self.dist.is_main:
            return {}
        with self._eager():
            return epoch_collapse_metrics(self.cfg, epoch, self.method.student, self.train_set, self.test_set)

    def _eager(self):
        """Evaluation runs a compiled student eagerly: compiling its eval-mode graph as well costs more than
        the evaluation passes save (``benchmarks/bench_compile.py``)."""
        return torch.compiler.set_stance("force_eager") if self.cfg.train.compile else contextlib.nullcontext()

    def _autocast(self):
        return autocast(self.device, self.amp_dtype)

    def _train_epoch(self, epoch: int) -> dict:
        cfg, method, loader = self.cfg, self.method, self.train_loader
        method.train()
        steps = len(loader)
        sums: dict[str, torch.Tensor] = {}
        correct = torch.zeros((), device=self.device, dtype=torch.float64)
        seen = 0
        check_every = 1 if self.device.type == "cpu" else 25  # NaN checks cost a host sync on GPU
        bar = tqdm(loader, total=steps, desc=f"epoch {epoch + 1}/{cfg.train.epochs}", leave=False,
                   disable=not (cfg.train.progress and self.dist.is_main), dynamic_ncols=True)
        start = time.perf_counter()
        for i, (x, y) in enumerate(bar):
            self._select_teacher_rows(i)
            lr = self.optimizer.param_groups[0]["lr"]
            out = self._step(self._to_layout(x), y, i, steps)
            for name, value in out.items():
                if name != "logits" and value.dim() == 0:
                    sums[name] = sums.get(name, 0) + value.detach().float()
            correct += (out["logits"].argmax(1) == y).sum()
            seen += y.numel()
            if (i + 1) % check_every == 0 or i + 1 == steps:
                self._check_finite(sums["loss"], epoch, i)
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

    def _step(self, x: torch.Tensor, y: torch.Tensor, batch: int = 0, batches: int = 1) -> dict[str, torch.Tensor]:
        """Forward and backward of batch ``batch`` of ``batches``; an optimizer step after every
        ``optim.accumulate`` batches (and after the epoch's last), on the gradient of their samples' mean loss."""
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
            with self._autocast():
                out = self.model(x, y)
            if first:
                self.optimizer.zero_grad(set_to_none=True)
            self.method.backward(out, scale)
        if last:
            self._optimizer_step()
        return out

    def _optimizer_step(self) -> None:
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

    def _check_finite(self, loss_sum: torch.Tensor, epoch: int, step: int) -> None:
        if not torch.isfinite(loss_sum).item():
            where = f"epoch {epoch + 1}, step {step + 1} (global step {epoch * len(self.train_loader) + step + 1})"
            hint = self.method.divergence_hint
            raise TrainingDiverged(
                f"the training loss became {loss_sum.item()} at or before {where}; {self._kept(epoch)}. "
                + (f"{hint}. " if hint else "") + "Lower optim.lr, set optim.grad_clip, or check the data"
            )

    @torch.no_grad()
    def _check_epoch_is_good(self, epoch: int, record: dict) -> None:
        """An epoch is saved only with finite weights and a finite test loss: the loss check of the training
        steps misses a blow-up in an epoch's last step, which would save 3e38 weights as a good checkpoint."""
        state = {k: v for k, v in self.method.state_dict().items() if v.is_floating_point()}
        finite = torch.stack([torch.isfinite(v).all() for v in state.values()]).cpu().tolist()
        bad = next((name for name, ok in zip(state, finite) if not ok), None)
        loss = record.get("test_loss", 0.0)
        if all_ranks_ok(bad is None and math.isfinite(loss)):
            return
        what = (f"the weights ({bad}) are not finite" if bad else f"the test loss is {loss}" if not math.isfinite(loss)
                else "another process found non-finite weights")
        raise TrainingDiverged(
            f"after epoch {epoch + 1} {what}; that epoch was not saved, {self._kept(epoch)}. "
            "Lower optim.lr, set optim.grad_clip, or check the data"
        )

    def _kept(self, epoch: int) -> str:
        return (f"the last good checkpoint (after epoch {epoch}) is kept in {self.run_dir}" if epoch > 0
                else "no checkpoint had been written yet")

    @torch.no_grad()
    def _evaluate(self) -> dict:
        """``test_acc``/``test_loss``, and ``val_acc``/``val_loss`` when the run has a validation split."""
        with self._eager():
            record = self._evaluate_split(self.test_loader, "test")
            if self.val_loader is not None:
                record |= self._evaluate_split(self.val_loader, "val")
        return record

    def _predict(self, x: torch.Tensor) -> torch.Tensor:
        return self.method.predict(x) if self.ema is None else self.ema.module(x)

    @torch.no_grad()
    def _evaluate_split(self, loader, split: str) -> dict:
        self.method.eval()
        correct = torch.zeros((), device=self.device, dtype=torch.float64)
        loss = torch.zeros((), device=self.device, dtype=torch.float64)
        for x, y in loader:
            with self._autocast():
                logits = self._predict(self._to_layout(x)).float()
            loss += torch.nn.functional.cross_entropy(logits, y, reduction="sum")
            correct += (logits.argmax(1) == y).sum()
        self.method.train()
        n = len(loader.dataset)
        return {f"{split}_acc": 100 * correct.item() / n, f"{split}_loss": loss.item() / n}
