"""Distillation across tokenizers in ``kdcollapse distill-lm`` (``student_tokenizer`` with ``loss.divergence=uld``
or ``gold``): the LM task with the teacher on its own tokens.

Every text is tokenized by both tokenizers and cut into rows holding the same bytes on both sides
(:func:`kdcollapse.lm.paired_blocks`); the student runs on its row, the teacher, online, on its own, and the loss
of a micro-batch is ``distill_weight`` × ULD or GOLD's hybrid (:func:`kdcollapse.losses.cross_tokenizer.uld_loss`:
the two answers aligned by byte offsets, groups merged by ``cross_tokenizer.merge``, both sides at
``loss.temperature``, no τ² factor, as TRL's ``ULDLoss``) plus ``ce_weight`` × the student's next-token
cross-entropy on its own counted tokens. Both models' logits are cut to their tokenizer's size (a head padded
beyond it has rows no text maps to). Everything else — steps, seeds, commits, resume — is the LM task's.

Token perplexities of two tokenizers do not compare (a tokenizer that cuts text into fewer tokens has a higher
per-token perplexity at the same quality), so the evaluation reports, beside the student's perplexity per token
(which compares students of one tokenizer), its perplexity per byte of UTF-8 text, exp(Σ CE / Σ bytes predicted),
and the teacher's on the same rows; and the ULD distance of student to teacher at τ = 1 (``uld``).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kdcollapse import lm
from kdcollapse.config_lm import LMConfig
from kdcollapse.errors import DataError, KdcollapseError
from kdcollapse.losses.cross_tokenizer import VocabularyMatch, uld_loss
from kdcollapse.train._lm_task import LMTask, cache_dir, select


def lm_task(cfg: LMConfig, rank: int = 0, world_size: int = 1) -> LMTask:
    """The task of ``cfg``: across tokenizers when it names a ``student_tokenizer``."""
    return (CrossTokenizerTask if cfg.student_tokenizer is not None else LMTask)(cfg, rank, world_size)


class CrossTokenizerTask(LMTask):
    """:class:`LMTask` with paired rows (``pairs``), the teacher's tokenizer and ULD / GOLD (module doc);
    ``tokenizer`` is the student's."""

    def prepare(self) -> None:
        cfg = self.cfg
        self.tokenizer = lm.load_tokenizer(cfg.student_tokenizer, cache_dir=cache_dir(cfg))
        self.teacher_tokenizer = lm.load_tokenizer(cfg.teacher, cache_dir=cache_dir(cfg))
        spec = cfg.data_spec
        examples = lm.read_examples(spec.source, format=spec.format, fields=lm.DataFields(**spec.fields))
        splits = lm.paired_blocks(self.tokenizer, self.teacher_tokenizer, examples, cfg.block_size,
                                  layout=spec.layout, loss_on=spec.loss_on)
        missing = [s for s in lm.SPLITS if s not in splits]
        if missing:
            raise DataError(f"the data give no row of {cfg.block_size} tokens in the {' and '.join(missing)} split(s) "
                            f"(splits are by document: give more examples, or a smaller block_size)")
        chosen = {s: select(splits[s], cfg.train_blocks if s == "train" else cfg.eval_blocks) for s in lm.SPLITS}
        self.pairs = chosen["train"]
        self.train, self.train_mask = self.pairs.student.ids, self.pairs.student.targets[:, 1:]
        self.held_out = {s: chosen[s] for s in ("validation", "test")}
        self.vocab = (len(self.tokenizer), len(self.teacher_tokenizer))
        self.match = (VocabularyMatch.from_tokenizers(self.tokenizer, self.teacher_tokenizer)
                      if cfg.loss.divergence == "gold" else None)
        self.stored, self.references = None, {}
        summary = {s: {"examples": b.examples, "blocks": len(b), "counted_tokens": int(b.student.targets.sum()),
                       "teacher_counted_tokens": int(b.teacher.targets.sum()), "truncated": b.truncated}
                   for s, b in chosen.items()}
        self.data = {"tokenizer": self.tokenizer, "corpus_summary": summary}

    def loss(self, student, micro: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        needs_teacher = self.cfg.loss.divergence != "none" and self.cfg.loss.distill_weight
        return cross_tokenizer_loss(self.cfg, student, self.teacher.model if needs_teacher else None,
                                    self.pairs.select(micro), self.vocab, self.match)

    def evaluate(self, student) -> dict:
        """``validation_*`` and ``test_*``: perplexity per token and per byte, the teacher's per byte, ULD."""
        record = {}
        for split, rows in self.held_out.items():
            record.update({f"{split}_{key}": value for key, value in
                           cross_tokenizer_evaluate(student, self.teacher.model, rows, self.vocab,
                                                    self.cfg.cross_tokenizer.merge).items()})
        return record


def _logits(model, ids: torch.Tensor, vocab: int, role: str, precision: str = "float32") -> torch.Tensor:
    logits = lm.teacher_logits(model, ids, precision)
    if logits.shape[-1] < vocab:
        raise KdcollapseError(f"the {role}'s output head has {logits.shape[-1]} rows but its tokenizer {vocab} tokens")
    return logits[..., :vocab].float()


def _distance(student_logits, teacher_logits, rows: lm.PairedBlocks, *, match, merge: str, temperature: float,
              beta: float, weights) -> torch.Tensor:
    s, t = rows.student, rows.teacher
    return uld_loss(student_logits, teacher_logits, s.labels(), t.labels(), s.ids, t.ids, s.offsets, t.offsets,
                    match=match, strategy=merge, student_temperature=temperature, teacher_temperature=temperature,
                    skip_student_eos=False, skip_teacher_eos=False, beta=beta, weights=weights)


def cross_tokenizer_loss(cfg: LMConfig, student, teacher, rows: lm.PairedBlocks, vocab: tuple[int, int],
                         match: VocabularyMatch | None) -> torch.Tensor:
    """The loss of one micro-batch of paired rows (module doc); ``teacher`` None: cross-entropy only."""
    loss_cfg = cfg.loss
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
        logits = _logits(student, rows.student.ids, vocab[0], "student")
    total = logits.new_zeros(())
    if loss_cfg.ce_weight:
        mask = rows.student.targets[:, 1:]
        total = total + loss_cfg.ce_weight * F.cross_entropy(logits[:, :-1][mask], rows.student.ids[:, 1:][mask])
    if teacher is not None:
        with torch.no_grad():
            teacher_logits = _logits(teacher, rows.teacher.ids, vocab[1], "teacher", cfg.teacher_precision)
        beta = loss_cfg.beta if loss_cfg.beta is not None else 0.5
        total = total + loss_cfg.distill_weight * _distance(
            logits, teacher_logits, rows, match=match, merge=cfg.cross_tokenizer.merge,
            temperature=loss_cfg.temperature, beta=beta, weights=cfg.cross_tokenizer.weights)
    return total


@torch.no_grad()
def cross_tokenizer_evaluate(student, teacher, rows: lm.PairedBlocks, vocab: tuple[int, int], merge: str = "bayesian",
                             batch: int = 4) -> dict:
    """``perplexity`` (per student token), ``byte_perplexity`` (exp of the student's summed cross-entropy over
    the UTF-8 bytes its predictions bring in, :meth:`~kdcollapse.lm.PairedSide.predicted_bytes`),
    ``teacher_byte_perplexity`` (the teacher's, on the same rows) and ``uld`` (mean per row, τ = 1)."""
    was_training = student.training
    student.eval()
    sums = {"ce": 0.0, "tokens": 0, "bytes": 0, "teacher_ce": 0.0, "teacher_bytes": 0, "uld": 0.0}
    for start in range(0, len(rows), batch):
        part = rows.select(torch.arange(start, min(start + batch, len(rows))))
        s_logits = _logits(student, part.student.ids, vocab[0], "student")
        t_logits = _logits(teacher, part.teacher.ids, vocab[1], "teacher")
        for side, logits, ce, size in ((part.student, s_logits, "ce", "bytes"),
                                       (part.teacher, t_logits, "teacher_ce", "teacher_bytes")):
            mask = side.targets[:, 1:]
            sums[ce] += float(F.cross_entropy(logits[:, :-1][mask], side.ids[:, 1:][mask], reduction="sum"))
            sums[size] += int(side.predicted_bytes().sum())
        sums["tokens"] += int(part.student.targets[:, 1:].sum())
        sums["uld"] += float(_distance(s_logits, t_logits, part, match=None, merge=merge, temperature=1.0, beta=0.5,
                                       weights=None)) * len(part)
    student.train(was_training)
    return {"perplexity": math.exp(sums["ce"] / max(1, sums["tokens"])),
            "byte_perplexity": math.exp(sums["ce"] / max(1, sums["bytes"])),
            "teacher_byte_perplexity": math.exp(sums["teacher_ce"] / max(1, sums["teacher_bytes"])),
            "uld": sums["uld"] / len(rows)}
