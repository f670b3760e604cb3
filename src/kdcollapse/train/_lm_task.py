"""The language-model task of the run engine: what ``kdcollapse distill-lm`` adds to the shared loop.

The engine (:class:`kdcollapse.train._lm.LMTrainer`) owns the loop, optimizer, schedule, checkpoints, metrics
and trackers; this module owns the task-specific part, beside the method contract of image runs: the token
blocks of the corpus, the teacher and its stored top-k tokens (a cache shared by every run), the blocks of
step s (drawn from a generator seeded by (seed, s), so a resumed run continues bit for bit), sampling for
on-policy data, the loss of one micro-batch (fused with the student's head: no (N, V) tensor) and the
evaluation (perplexity, agreement with the teacher and forward KL to it, the whole teacher: its stored last hidden
states and head on the held-out blocks, :mod:`kdcollapse.lm._reference`).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
from pathlib import Path

import torch
import torch.nn.functional as F

from kdcollapse import lm
from kdcollapse.config_lm import GenerationSection, LMConfig
from kdcollapse.errors import DataError
from kdcollapse.losses import TeacherHead, distillm2_fused_loss, fused_head_loss
from kdcollapse.losses.distillm2 import SKEW
from kdcollapse.losses.llm import token_divergence


def cache_dir(cfg: LMConfig) -> Path:
    path = Path(cfg.cache_dir or os.environ.get("KDCOLLAPSE_CACHE") or Path.home() / ".cache" / "kdcollapse")
    path.mkdir(parents=True, exist_ok=True)
    return path


class _Teacher:
    """The teacher model, loaded only when something needs it (stored tokens may make it unnecessary)."""

    def __init__(self, source: str, cache: Path | None = None):
        self.source, self.cache, self._lm = source, cache, None

    @property
    def model(self):
        if self._lm is None:
            self._lm = lm.load_language_model(self.source, cache_dir=self.cache)
        return self._lm.model


def select(blocks: lm.TokenBlocks, count: int | None) -> lm.TokenBlocks:
    """``count`` blocks drawn without replacement by a fixed generator (the same for every run)."""
    if count is None or count >= len(blocks):
        return blocks
    order = torch.randperm(len(blocks), generator=torch.Generator().manual_seed(0))[:count].sort().values
    return blocks.select(order)


# stored k that a smaller k is cut from (TeacherTokens.top) when the cache holds one, sparing the teacher's pass
CUT_FROM = (64, 128, 256, 512, 1024)


def teacher_tokens(cfg: LMConfig, teacher: _Teacher, corpus_key: str, split: str, blocks: torch.Tensor,
                   k: int) -> lm.TeacherTokens:
    """The teacher's top-``k`` tokens on ``blocks``, from the cache (keyed by teacher, corpus, split, blocks,
    k, τ and the teacher's precision), else cut from a cached store of a larger k of :data:`CUT_FROM`, else
    computed and cached."""
    # a float32 store's key is as it was before teacher_precision existed (the caches already built stay valid)
    precision = [] if cfg.teacher_precision == "float32" else [cfg.teacher_precision]

    def directory_of(k: int) -> Path:
        key = hashlib.sha256(json.dumps([cfg.teacher, corpus_key, split, lm.TeacherTokens.__name__, k,
                                         cfg.loss.temperature, *precision]).encode()
                             + lm.blocks_digest(blocks).encode())
        return cache_dir(cfg) / f"teacher-tokens-{key.hexdigest()[:16]}"

    directory = directory_of(k)
    if not (directory / "manifest.json").is_file():
        for larger in (c for c in CUT_FROM if c > k):
            if (directory_of(larger) / "manifest.json").is_file():
                return lm.TeacherTokens.load(directory_of(larger)).top(k)
        lm.store_teacher_tokens(teacher.model, blocks, directory, k=k, temperature=cfg.loss.temperature,
                                precision=cfg.teacher_precision)
    return lm.TeacherTokens.load(directory)


def teacher_reference(cfg: LMConfig, teacher: _Teacher, corpus_key: str, split: str,
                      blocks: torch.Tensor) -> lm.TeacherReference:
    """The teacher's whole distribution on held-out ``blocks`` (its last hidden states and head), from the cache
    (keyed by teacher, corpus, split and blocks), else computed and cached."""
    key = hashlib.sha256(json.dumps([cfg.teacher, corpus_key, split, lm.TeacherReference.__name__]).encode()
                         + lm.blocks_digest(blocks).encode())
    directory = cache_dir(cfg) / f"teacher-reference-{key.hexdigest()[:16]}"
    if not (directory / "manifest.json").is_file():
        lm.store_teacher_reference(teacher.model, blocks, directory)
    return lm.TeacherReference.load(directory)


class LMTask:
    """The task of one LM run: its data (:meth:`prepare`, once, on the main process first), the blocks of
    each step (:meth:`step_blocks`), the loss of a micro-batch (:meth:`loss`) and :meth:`evaluate`."""

    def __init__(self, cfg: LMConfig, rank: int = 0, world_size: int = 1):
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.teacher = _Teacher(cfg.teacher, cache_dir(cfg))
        self.data: dict = {}

    def prepare(self) -> None:
        self.data = _data(self.cfg, self.teacher)
        for key in ("tokenizer", "train", "train_mask", "held_out", "held_out_masks", "stored", "references"):
            setattr(self, key, self.data[key])

    def step_blocks(self, step: int) -> tuple[torch.Tensor, torch.Generator]:
        """This process's training-block indices of optimizer step ``step`` (``batch_size × accumulate``
        of them) and the generator of its samples, both a function of (seed, step, rank)."""
        cfg = self.cfg
        g = torch.Generator().manual_seed(cfg.seed * 1_000_003 + step)
        index = torch.randint(len(self.train), (cfg.batch_size * cfg.accumulate * self.world_size,), generator=g)
        index = index.view(cfg.accumulate, self.world_size, cfg.batch_size)[:, self.rank].reshape(-1)
        sampling = torch.Generator().manual_seed((cfg.seed * 1_000_003 + step) * 1_009 + 1 + self.rank)
        return index, sampling

    def loss(self, student, micro: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return _loss(self.cfg, student, self.teacher, self.train, self.stored, micro, generator,
                     self.tokenizer.eos_token_id, self.train_mask)

    def evaluate(self, student) -> dict:
        """``validation_*`` and ``test_*``: perplexity, agreement and forward KL (see :func:`evaluate`)."""
        record = {}
        for split, blocks in self.held_out.items():
            record.update({f"{split}_{key}": value for key, value in
                           evaluate(student, blocks, self.references[split], self.cfg,
                                    mask=self.held_out_masks[split]).items()})
        return record


def _data(cfg: LMConfig, teacher: _Teacher) -> dict:
    """The tokenizer, the training and held-out blocks, and the stored teacher tokens (computed once and
    cached: the teacher is loaded only when they are missing or the teacher runs online)."""
    tokenizer = lm.load_tokenizer(cfg.teacher, cache_dir=cache_dir(cfg))
    splits, data_key = lm.data_blocks(tokenizer, cfg.data_spec, cfg.block_size, cache_dir=cache_dir(cfg))
    missing = [s for s in lm.SPLITS if s not in splits]
    if missing:
        raise DataError(f"the data give no block of {cfg.block_size} tokens in the {' and '.join(missing)} split(s) "
                        f"(splits are by document: give more examples, or a smaller block_size)")
    chosen = {s: select(splits[s], cfg.train_blocks if s == "train" else cfg.eval_blocks) for s in lm.SPLITS}
    train, held_out = chosen["train"].ids, {s: chosen[s].ids for s in ("validation", "test")}
    text_distilled = cfg.loss.divergence != "none" and not cfg.generation.seq_kd and cfg.generation.lmbda < 1
    stored = teacher_tokens(cfg, teacher, data_key, "train", train, cfg.teacher_k) if text_distilled and cfg.teacher_k \
        else None
    references = {s: teacher_reference(cfg, teacher, data_key, s, b) for s, b in held_out.items()}
    summary = {s: {"examples": b.examples, "blocks": len(b), "counted_tokens": int(b.loss_mask.sum()),
                   "truncated": b.truncated} for s, b in chosen.items()}
    return {"tokenizer": tokenizer, "train": train, "train_mask": chosen["train"].loss_mask, "held_out": held_out,
            "held_out_masks": {s: chosen[s].loss_mask for s in held_out}, "stored": stored,
            "references": references, "corpus_summary": summary}


def _loss(cfg: LMConfig, student, teacher: _Teacher, train: torch.Tensor, stored, micro: torch.Tensor,
          generator: torch.Generator, eos: int | None, train_mask: torch.Tensor | None = None):
    """The loss of one micro-batch: its first blocks are corpus text (or, with ``seq_kd``, the teacher's
    samples after their prompts), its last ``lmbda`` × ``batch_size`` blocks the student's samples. A
    sampled block counts only at the positions that predict its completion; the student's own samples are
    scored by the divergence alone (no cross-entropy on them). A text block counts the positions ``train_mask``
    (n, T - 1) marks (the data's ``loss_on``; default every position). The loss is the mean over every counted
    position of the micro-batch. DistiLLM-2 (``loss.divergence=distillm2``, seq_kd and lmbda 0.5): the student's
    half answers the teacher's half's prompts, and one ``distillm2_fused_loss`` scores both halves."""
    gen, loss_cfg = cfg.generation, cfg.loss
    ids = train[micro].clone()
    on_policy = round(gen.lmbda * len(micro))
    text = len(micro) - on_policy
    keep = (train_mask[micro].clone() if train_mask is not None  # the positions whose next token the data count
            else torch.ones(len(ids), ids.shape[1] - 1, dtype=torch.bool))
    masked = gen.enabled or not bool(keep.all())
    vocab = student.get_output_embeddings().weight.shape[0]
    if loss_cfg.pairs_responses:  # DistiLLM-2: the student answers the prompts the teacher answers
        ids[text:], keep[text:] = ids[:on_policy].clone(), keep[:on_policy].clone()
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
            online = lm.teacher_hidden(teacher.model, ids[scored:], cfg.teacher_precision)[:, :-1]
    if loss_cfg.pairs_responses:  # one fused loss: skew KL on the teacher's responses, skew reverse KL on the student's
        h = hidden.reshape(-1, hidden.shape[-1])
        return distillm2_fused_loss(
            h, weight, _head(teacher, online), (torch.arange(len(ids)) >= text).repeat_interleave(labels.shape[1]),
            SKEW if loss_cfg.alpha is None else loss_cfg.alpha, loss_cfg.temperature, labels=labels.reshape(-1),
            ce_weight=loss_cfg.ce_weight, distill_weight=loss_cfg.distill_weight, mask=keep.reshape(-1),
            chunk_size=cfg.chunk_size)
    parts = []  # (rows, teacher, ce_weight)
    if text:
        if loss_cfg.divergence == "none":
            source = None
        elif scored:
            source = stored.rows(micro[:text], slice(None, -1), cfg.teacher_tail)
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
            loss_cfg.temperature, labels=labels[rows].reshape(-1), ce_weight=ce_weight,
            distill_weight=loss_cfg.distill_weight if source is not None else 0.0,
            mask=keep[rows].reshape(-1) if masked else None, chunk_size=cfg.chunk_size,
            **(loss_cfg.parameters() if source is not None else {})))
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
def evaluate(model, blocks: torch.Tensor, reference: lm.TeacherReference, cfg: LMConfig, batch: int = 4,
             mask: torch.Tensor | None = None) -> dict:
    """Perplexity (exp of the mean next-token cross-entropy), agreement of the student's argmax with the
    teacher's, and the forward KL per token to the teacher's whole distribution at τ (``reference``: its hidden
    states and head), over every position of ``blocks`` whose next token the data count (``mask`` (n, T - 1),
    default all)."""
    was_training = model.training
    model.eval()
    ce = agree = kl = 0.0
    count = 0
    vocab = reference.weight.shape[0]
    temperature = cfg.loss.temperature
    for start in range(0, len(blocks), batch):
        ids = blocks[start:start + batch]
        index = torch.arange(start, start + len(ids))
        counted = (mask[start:start + batch].reshape(-1) if mask is not None
                   else torch.ones(len(ids) * (ids.shape[1] - 1), dtype=torch.bool))
        logits = model(ids).logits[:, :-1, :vocab].float()
        flat = logits.reshape(-1, vocab)[counted]
        labels = ids[:, 1:].reshape(-1)[counted]
        teacher_log_probs = reference.rows(index, slice(None, -1)).log_probs(slice(None), vocab, temperature)[counted]
        ce += float(F.cross_entropy(flat, labels, reduction="sum"))
        agree += float((flat.argmax(-1) == teacher_log_probs.argmax(-1)).sum())
        kl += float(token_divergence(flat / temperature, teacher_log_probs, "forward_kl", reduction="sum"))
        count += len(labels)
    model.train(was_training)
    return {"perplexity": math.exp(ce / count), "agreement": agree / count, "forward_kl": kl / count}


@torch.no_grad()
def top_k_costs(model, blocks: torch.Tensor, k: int, temperature: float = 1.0, batch: int = 4,
                mask: torch.Tensor | None = None) -> dict:
    """What a store of the teacher ``model``'s top ``k`` tokens keeps of it on ``blocks`` (the positions ``mask``
    counts): ``top_k_coverage``, the share of next tokens among the top k; ``tail_mass``, the mean mass outside
    them; and for the rule that spreads that mass evenly (``TopKTeacher`` tail "uniform"): ``uniform_tail_kl``,
    KL(teacher ‖ that distribution), and ``uniform_tail_perplexity``, that distribution's own perplexity, a floor
    for a student that matches it. At τ = 1 only (the perplexity is of the teacher's τ = 1 distribution)."""
    from kdcollapse.losses import TopKTeacher

    covered = rest = kl = ce = 0.0
    count = 0
    for start in range(0, len(blocks), batch):
        ids = blocks[start:start + batch]
        counted = (mask[start:start + batch].reshape(-1) if mask is not None
                   else torch.ones(len(ids) * (ids.shape[1] - 1), dtype=torch.bool))
        logits = model(ids).logits[:, :-1].float()
        log_p = F.log_softmax(logits.reshape(-1, logits.shape[-1])[counted] / temperature, -1)
        labels = ids[:, 1:].reshape(-1)[counted]
        stored = TopKTeacher.from_logits(log_p, k)
        flat = stored.log_probs(slice(None), log_p.shape[-1], 1.0)
        covered += float((stored.indices.long() == labels.unsqueeze(1)).any(1).sum())
        rest += float(stored.log_rest.exp().sum())
        kl += float((log_p.exp() * (log_p - flat)).sum())
        ce -= float(flat.gather(1, labels.unsqueeze(1)).sum())
        count += len(labels)
    return {"top_k_coverage": covered / count, "tail_mass": rest / count, "uniform_tail_kl": kl / count,
            "uniform_tail_perplexity": math.exp(ce / count)}
