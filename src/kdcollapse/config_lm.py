"""The language-model run config (``kdcollapse distill-lm``): the config layer's sections for the LM task.

Built by the same loader as the image run config (:func:`kdcollapse.config.build_section`: YAML plus
``key=value`` overrides, unknown keys and mistyped values are errors). ``loss`` takes the chosen token
divergence's parameters by name (``loss.beta``, ``loss.alpha``): its keys are read from the loss catalogue's
token divergences (:func:`kdcollapse.losses.llm.token_divergences`), so a newly declared divergence brings
its parameters with it. :func:`load_run_config` opens the ``config.yaml`` of either task.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from kdcollapse import lm
from kdcollapse.config import RunConfig, build_section, config_from_dict, read_yaml
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.losses.cross_tokenizer import LOSSES as CROSS_TOKENIZER_LOSSES
from kdcollapse.losses.distillm2 import check_skew
from kdcollapse.losses.fused import TAILS
from kdcollapse.losses.llm import token_divergences
from kdcollapse.lm import check_lora_targets, split_student

SMALL_LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
               "tie_word_embeddings": True}  # 15,730,944 parameters with SmolLM2's 49,152 tokens (12.6 M of them embeddings)

LM_TASK = "lm"
DISTILLM2 = "distillm2"  # DistiLLM-2's objective: a loss of two divergences over paired responses


def check_number(key: str, value, *, positive: bool = False) -> None:
    """A finite number, > 0 (``positive``) or >= 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
        value > 0 if positive else value >= 0)
    if not ok:
        raise ConfigError(f"{key} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")


def divergence_parameters() -> dict[str, list[str]]:
    """Every declared token divergence parameter name -> the divergences that take it."""
    takes: dict[str, list[str]] = {}
    for name, info in token_divergences().items():
        for key in info.divergence.parameters:
            takes.setdefault(key, []).append(name)
    return takes


def _plain_first(name: str) -> tuple[bool, str]:
    return (name not in ("forward_kl", "reverse_kl"), name)


@dataclass
class _LossBase:
    divergence: str = "forward_kl"  # a declared token divergence, or "none" for cross-entropy only
    temperature: float = 1.0
    ce_weight: float = 0.0
    distill_weight: float = 1.0

    def parameters(self) -> dict[str, float]:
        """The set (non-null) divergence parameters, by name (the declaration's defaults fill the rest)."""
        return {key: getattr(self, key) for key in divergence_parameters() if getattr(self, key) is not None}

    @property
    def pairs_responses(self) -> bool:
        """DistiLLM-2's objective: the teacher's and the student's responses to the same prompts, each half with
        its own divergence (``generation.seq_kd`` and ``generation.lmbda=0.5``; ``train/_lm_task.py``)."""
        return self.divergence == DISTILLM2

    @property
    def cross_tokenizer(self) -> bool:
        """Whether the divergence compares two tokenizers' distributions (ULD, GOLD: ``student_tokenizer``)."""
        return self.divergence in CROSS_TOKENIZER_LOSSES

    def __post_init__(self):
        divergences = token_divergences()
        if self.divergence not in ("none", DISTILLM2) and self.divergence not in divergences and not self.cross_tokenizer:
            raise ConfigError(f"loss.divergence must be one of none, {', '.join(sorted(divergences, key=_plain_first))}, "
                              f"{DISTILLM2} (teacher and student responses), {', '.join(CROSS_TOKENIZER_LOSSES)} "
                              f"(across tokenizers); got {self.divergence!r}")
        if self.divergence == "none" and not self.ce_weight:
            raise ConfigError("loss.divergence=none trains on cross-entropy only: set loss.ce_weight > 0")
        for key, value in self.parameters().items():
            takes = [*divergence_parameters()[key], *{"beta": ["gold"], "alpha": [DISTILLM2]}.get(key, [])]
            if self.divergence not in takes:
                raise ConfigError(f"loss.{key}={value!r}: loss.divergence={self.divergence} takes no {key} (only "
                                  f"{', '.join(takes)} do); remove loss.{key}")
        if self.divergence == "gold" and self.beta is not None and not (
                isinstance(self.beta, (int, float)) and 0 <= self.beta <= 1):
            raise ConfigError(f"loss.beta of gold (its JSD on the shared tokens) must be a number in [0, 1], got "
                              f"{self.beta!r}")
        if self.pairs_responses:
            try:
                check_skew(self.alpha)
            except KdcollapseError as err:
                raise ConfigError(f"loss.{err}") from None
        elif self.divergence != "none" and not self.cross_tokenizer:
            try:  # its parameters' ranges, before the teacher loads
                divergences[self.divergence].divergence.bind(self.divergence, self.parameters())
            except KdcollapseError as err:
                raise ConfigError(f"loss.{err}") from None
        check_number("loss.temperature", self.temperature, positive=True)
        check_number("loss.ce_weight", self.ce_weight)
        check_number("loss.distill_weight", self.distill_weight)


@functools.cache
def _loss_section(keys: tuple[str, ...]) -> type:
    cls = dataclasses.make_dataclass("LossSection", [(key, float | None, field(default=None)) for key in keys],
                                     bases=(_LossBase,))
    cls.__module__ = __name__
    cls.__doc__ = ("The loss of an LM run: the token divergence, its named parameters (loss.beta, loss.alpha, ... "
                   "as declared), temperature and the weights of CE and distillation.")
    return cls


def loss_section() -> type:
    """The ``loss`` section's dataclass for the token divergences declared now: ``loss.<parameter>`` (null: the
    declaration's default) for every parameter one of them names. Read from the registry each time a config is
    loaded (:func:`load_lm_config`), so a divergence declared by a module of ``--import`` brings its keys."""
    global LossSection
    LossSection = _loss_section(tuple(sorted(divergence_parameters())))
    return LossSection


LossSection = loss_section()


@dataclass
class GenerationSection:
    """Sampled blocks (GKD, Agarwal et al. 2024; TRL's GKDTrainer ``lmbda``, ``seq_kd``): the prompt is the
    first ``prompt_tokens`` of a training block, the completion ``max_new_tokens`` sampled tokens, and only
    the completion's positions count in the loss."""

    lmbda: float = 0.0  # fraction of each micro-batch's blocks replaced by the student's samples (on-policy)
    seq_kd: bool = False  # the other blocks: the teacher's samples after the same prompts, not the corpus text
    prompt_tokens: int | None = None  # default: block_size // 2
    max_new_tokens: int | None = None  # default: block_size - prompt_tokens
    temperature: float = 0.9  # sampling temperature (TRL's default); the loss keeps loss.temperature

    @property
    def enabled(self) -> bool:
        return self.lmbda > 0 or self.seq_kd


@dataclass
class CrossTokenizerSection:
    """How ULD and GOLD (``loss.divergence=uld | gold`` with ``student_tokenizer``) compare the two tokenizations
    of one text (:mod:`kdcollapse.losses.cross_tokenizer`): ``merge`` turns a group of tokens covering the same
    bytes into one distribution (bayesian: at the group's last token, times the probabilities of its earlier
    tokens; observed: TRL's default); GOLD's weights of its matched (JSD) and unmatched (ULD) parts, null: the
    shared tokens' share of the teacher's vocabulary and the rest."""

    merge: Literal["bayesian", "observed"] = "bayesian"
    matched_weight: float | None = None
    unmatched_weight: float | None = None

    @property
    def weights(self) -> tuple[float, float] | None:
        return None if self.matched_weight is None else (self.matched_weight, self.unmatched_weight)


@dataclass
class DistributedSection:
    """How ``torchrun`` processes share the student: ``ddp`` (each holds all of it; gradients all-reduced)
    or ``fsdp`` (FSDP2, ``fully_shard`` of each decoder layer: parameters, gradients and AdamW state split)."""

    strategy: Literal["ddp", "fsdp"] = "ddp"


_POSITIVE = ("block_size", "eval_blocks", "batch_size", "accumulate", "eval_every", "chunk_size", "log_every")


@dataclass
class LMConfig:
    task: Literal["lm"] = LM_TASK  # what config.yaml says to tell an LM run from an image run
    teacher: str = lm.SMOLLM2  # "smollm2-135m", a model directory or a .gguf file
    student: dict = field(default_factory=lambda: dict(SMALL_LLAMA))  # a transformers config (vocab from the teacher)
    # or {init: {from: teacher, layers: distilbert | minitron | [...], keep: N}}: built from the teacher's layers;
    # either with lora: {r, alpha, dropout, target_modules, modules_to_save}: a LoRA adapter on it (lm/_lora.py)
    corpus: str = lm.PYTHON_DOCS  # "python-docs" or a directory of .txt files
    data: lm.DataSpec = field(default_factory=lm.DataSpec)  # a datasets source, its kind, loss mask and layout
    block_size: int = 128  # tokens per sequence
    train_blocks: int | None = 512  # the token budget: this many training blocks, drawn once (data seed 0)
    eval_blocks: int = 64  # validation and test blocks, drawn once
    batch_size: int = 8  # blocks per micro-batch
    accumulate: int = 1  # micro-batches per optimizer step
    steps: int = 100  # optimizer steps; 0: the student's initialisation evaluated and saved, nothing trained
    lr: float = 1e-3  # AdamW, linear warm-up then cosine decay to 0
    warmup: int = 10  # steps
    weight_decay: float = 0.0
    loss: LossSection = field(default_factory=lambda: loss_section()())
    generation: GenerationSection = field(default_factory=GenerationSection)
    distributed: DistributedSection = field(default_factory=DistributedSection)
    teacher_k: int | None = 64  # stored top-k teacher tokens; None = the teacher runs online every step
    teacher_tail: Literal[TAILS] = "uniform"  # what a loss on stored tokens makes of the rest's
    # mass: spread evenly over the other tokens, or one outcome beside the top k (losses.TopKTeacher)
    student_tokenizer: str | None = None  # null: the teacher's; a tokenizer or model directory, or a .gguf file:
    # distillation across tokenizers (loss.divergence=uld | gold, the teacher online)
    cross_tokenizer: CrossTokenizerSection = field(default_factory=CrossTokenizerSection)
    eval_every: int = 50  # steps between evaluations and checkpoints (commits)
    chunk_size: int = 1024  # tokens per chunk of the fused head loss
    precision: Literal["float32", "bf16"] = "float32"  # bf16: autocast of the student's body
    # bf16: the teacher's body under autocast where it makes training targets (the stored tokens, the online
    # teacher), its head in float32; its samples (seq_kd) and every evaluation stay float32
    teacher_precision: Literal["float32", "bf16"] = "float32"
    seed: int = 0
    run_dir: str = "runs/lm"
    cache_dir: str | None = None  # corpus and teacher-token caches (default ~/.cache/kdcollapse)
    progress: bool = True  # a progress bar with rate and ETA on the console
    log_every: int = 10  # steps between the per-step scalars sent to TensorBoard and the trackers
    tensorboard: bool = False  # also log to run_dir/tensorboard (needs the tensorboard package)
    trackers: list[str] = field(default_factory=list)  # also log to W&B / MLflow (when installed)
    group: str = ""  # the trackers' group of this run (a study's name, set by `kdcollapse study`)

    def __post_init__(self):
        for key in _POSITIVE:
            value = getattr(self, key)
            if not (isinstance(value, int) and not isinstance(value, bool) and value >= (2 if key == "block_size" else 1)):
                raise ConfigError(f"'{key}' must be {'an int >= 2' if key == 'block_size' else 'a positive int'}, "
                                  f"got {value!r}")
        if not (isinstance(self.steps, int) and not isinstance(self.steps, bool) and self.steps >= 0):
            raise ConfigError(f"'steps' must be an int >= 0 (0: the initialisation evaluated, nothing trained), got "
                              f"{self.steps!r}")
        if self.teacher_k is not None and self.teacher_k < 1:
            raise ConfigError(f"'teacher_k' must be a positive int or null, got {self.teacher_k!r}")
        if self.train_blocks is not None and not (isinstance(self.train_blocks, int) and self.train_blocks >= 1):
            raise ConfigError(f"'train_blocks' must be a positive int or null (every block), got {self.train_blocks!r}")
        if not (isinstance(self.warmup, int) and 0 <= self.warmup <= self.steps):
            raise ConfigError(f"'warmup' must be an int in [0, steps={self.steps}] (steps of linear warm-up), got "
                              f"{self.warmup!r}")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**31):
            raise ConfigError(f"'seed' must be an int in [0, 2**31), got {self.seed!r}")
        bad = next((t for t in self.trackers if t not in ("wandb", "mlflow")), None)
        if bad is not None:
            raise ConfigError(f"'trackers' must be a list of wandb, mlflow; got {bad!r}")
        if not self.run_dir:
            raise ConfigError("'run_dir' must be a non-empty path")
        check_number("lr", self.lr, positive=True)
        check_number("weight_decay", self.weight_decay)
        if not isinstance(self.student, dict):
            raise ConfigError(f"'student' must be a mapping (a transformers config), got {self.student!r}")
        model_config, lora = split_student(self.student)  # student.lora: a LoRA adapter on the student
        for key, value in model_config.items():  # sizes and counts: transformers accepts 0 and fails mid-run
            if value is not None and (key.endswith("_size") or key.startswith("num_") or key in ("head_dim", "max_position_embeddings")) and \
                    not (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
                raise ConfigError(f"student.{key} must be a positive int, got {value!r}")
        # the student's architecture (or its init from the teacher), checked before the teacher loads
        init = lm.check_student_section(model_config)
        if self.distributed.strategy not in ("ddp", "fsdp"):
            raise ConfigError(f"distributed.strategy must be ddp or fsdp, got {self.distributed.strategy!r}")
        if self.distributed.strategy == "fsdp" and self.generation.enabled:
            raise ConfigError("distributed.strategy=fsdp does not take generation.lmbda or generation.seq_kd "
                              "(sampled blocks) in this version; use distributed.strategy=ddp")
        if lora is not None:  # module names checked here for a config's student, after the teacher for an init's
            check_lora_targets(None if init is not None else lm.language_model_config(model_config), lora)
        if self.data.source is not None and self.corpus != lm.PYTHON_DOCS:
            raise ConfigError(f"corpus={self.corpus!r} and data.source={self.data.source!r} both name the data: give "
                              f"one (data.source takes text folders too)")
        if self.teacher_tail == "rest" and self.teacher_k is None:
            raise ConfigError("teacher_tail=rest reads stored top-k teacher tokens; with teacher_k=null the teacher "
                              "runs online and gives every probability: remove teacher_tail or set teacher_k")
        self._check_generation()
        self._check_cross_tokenizer(init)

    def _check_cross_tokenizer(self, init) -> None:
        """``student_tokenizer`` and the ULD / GOLD divergences come together; what they cannot take is refused."""
        cross, divergence = self.cross_tokenizer, self.loss.divergence
        if cross.merge not in ("bayesian", "observed"):
            raise ConfigError(f"cross_tokenizer.merge must be bayesian or observed, got {cross.merge!r}")
        if (cross.matched_weight is None) != (cross.unmatched_weight is None):
            raise ConfigError("cross_tokenizer.matched_weight and cross_tokenizer.unmatched_weight come together: "
                              "give both or neither (null: the shared tokens' share of the teacher's vocabulary)")
        for key in ("matched_weight", "unmatched_weight"):
            if getattr(cross, key) is not None:
                check_number(f"cross_tokenizer.{key}", getattr(cross, key))
        if self.student_tokenizer is None:
            if self.loss.cross_tokenizer:
                raise ConfigError(f"loss.divergence={divergence} compares two tokenizers' distributions: set "
                                  f"student_tokenizer (a tokenizer directory or .gguf), or choose a divergence of one "
                                  f"vocabulary")
            if cross != CrossTokenizerSection():
                raise ConfigError("the cross_tokenizer section applies only with student_tokenizer (distillation "
                                  "across tokenizers); remove it")
            return
        if not isinstance(self.student_tokenizer, str) or not self.student_tokenizer:
            raise ConfigError(f"student_tokenizer must be a path or null (the teacher's), got {self.student_tokenizer!r}")
        if divergence != "none" and not self.loss.cross_tokenizer:
            raise ConfigError(f"loss.divergence={divergence} compares distributions over one vocabulary; the "
                              f"student_tokenizer's differs from the teacher's: choose loss.divergence="
                              f"{' or '.join(CROSS_TOKENIZER_LOSSES)} (or none)")
        if divergence != "gold" and cross.matched_weight is not None:
            raise ConfigError("cross_tokenizer.matched_weight and unmatched_weight weigh GOLD's parts: set "
                              "loss.divergence=gold or remove them")
        refused = (("teacher_k", self.teacher_k is not None, f"teacher_k={self.teacher_k}: stored teacher tokens "
                    "are the teacher's positions of its own tokenization; set teacher_k=null (the teacher runs online)"),
                   ("init", init is not None, "student.init copies the teacher's embeddings and head, which are of the "
                    "teacher's vocabulary; build the student from a transformers config"),
                   ("generation", self.generation.enabled, "generation.lmbda and generation.seq_kd (sampled blocks)"
                    " are not in this version's distillation across tokenizers; remove them"),
                   ("chat", self.data.format == "chat", "data.format=chat: each tokenizer renders a conversation "
                    "with its own chat template, so the texts differ; give prompt/completion strings"))
        for _, bad, message in refused:
            if bad:
                raise ConfigError(f"with student_tokenizer ({self.student_tokenizer}), {message}")

    @property
    def student_init(self) -> lm.StudentInit | None:
        """``student.init`` checked, or None for a student built from a ``transformers`` config."""
        return lm.check_student_section(split_student(self.student)[0])

    @property
    def data_spec(self) -> lm.DataSpec:
        """The data section with the source filled in: ``data.source``, else ``corpus``."""
        if self.data.source is not None:
            return self.data
        return dataclasses.replace(self.data, source=None if self.corpus == lm.PYTHON_DOCS else self.corpus)

    def _check_generation(self) -> None:
        gen = self.generation
        if not 0 <= gen.lmbda <= 1:
            raise ConfigError(f"generation.lmbda must be in [0, 1], got {gen.lmbda!r}")
        on_policy = gen.lmbda * self.batch_size
        if abs(on_policy - round(on_policy)) > 1e-9:
            raise ConfigError(f"generation.lmbda x batch_size must be a whole number of blocks, got "
                              f"{gen.lmbda} x {self.batch_size} = {on_policy:g}")
        if self.loss.pairs_responses and not (gen.seq_kd and gen.lmbda == 0.5):
            raise ConfigError(f"loss.divergence={DISTILLM2} scores the teacher's and the student's responses to the "
                              f"same prompts: set generation.seq_kd=true and generation.lmbda=0.5 (got seq_kd="
                              f"{gen.seq_kd}, lmbda={gen.lmbda})")
        if gen.lmbda and self.loss.divergence == "none":
            raise ConfigError("generation.lmbda > 0 scores the student's samples with the teacher: choose a "
                              "loss.divergence (not none)")
        if not gen.enabled:
            return
        if gen.prompt_tokens is None:
            gen.prompt_tokens = self.block_size // 2
        if gen.max_new_tokens is None:
            gen.max_new_tokens = self.block_size - gen.prompt_tokens
        if not (isinstance(gen.prompt_tokens, int) and isinstance(gen.max_new_tokens, int) and gen.prompt_tokens >= 1
                and gen.max_new_tokens >= 1 and gen.prompt_tokens + gen.max_new_tokens <= self.block_size):
            raise ConfigError(f"generation.prompt_tokens ({gen.prompt_tokens!r}) and generation.max_new_tokens "
                              f"({gen.max_new_tokens!r}) must be positive ints with a sum <= block_size "
                              f"({self.block_size})")
        if not gen.temperature >= 0:
            raise ConfigError(f"generation.temperature must be >= 0 (0: the most likely token), got {gen.temperature!r}")


def load_lm_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> LMConfig:
    """An :class:`LMConfig` from an optional YAML file and ``key=value`` overrides."""
    data = read_yaml(path) if path else {}
    loss_section()  # the loss keys of the divergences declared now (a module of --import may have added one)
    data.setdefault("task", LM_TASK)  # recipes and configs of older versions do not say it
    return build_section(LMConfig, data, overrides)


def is_lm_config(data: dict) -> bool:
    """Whether a config mapping is an LM run's: ``task: lm`` (a run of an older version: its ``teacher`` is a
    string and its ``student`` a mapping)."""
    return data.get("task") == LM_TASK or (isinstance(data.get("teacher"), str) and isinstance(data.get("student"), dict))


def load_run_config(path: str | Path) -> RunConfig | LMConfig:
    """The config of a run directory's ``config.yaml``, of either task."""
    data = read_yaml(path)
    return load_lm_config(path) if is_lm_config(data) else config_from_dict(data, saved_in=path)  # data: no imports


# what a resume of an LM run may change (steps: a longer run); everything else defines the run
LM_RESUMABLE_KEYS = ("steps", "eval_every", "cache_dir", "progress", "log_every", "tensorboard", "trackers", "group")


def tracking(cfg: RunConfig | LMConfig) -> tuple[list[str], str, bool]:
    """``(trackers, group, tensorboard)`` of a run config of either task."""
    section = cfg if isinstance(cfg, LMConfig) else cfg.train
    return list(section.trackers), section.group, section.tensorboard
