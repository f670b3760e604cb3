"""Distillation across tokenizers: ULD (Boizard et al. 2024, "Towards Cross-Tokenizer Distillation: the
Universal Logit Distillation Loss for LLMs") and the hybrid of TRL's GOLD trainer
(``trl/experimental/gold/gold_trainer.py``, ``ULDLoss``), with the token alignment they need.

Teacher and student tokenize the same completion text differently. Each token carries the UTF-8 byte span
(start, end) it covers in that text (:func:`tokenize_completion`); :func:`align_offsets` walks both
sequences and closes a group each time both reach the same byte boundary, so group g of the student and
group g of the teacher cover the same text. A group of several tokens becomes one distribution by the chain
rule (:func:`merge_groups`): ``"bayesian"`` — the distribution at the group's last token times the
probabilities of its earlier actual tokens, i.e. P(earlier tokens, last = v); ``"observed"`` (TRL's
default) — the distribution at the group's first answer position times the probabilities of the later
tokens (it reads the logits *at* each answer position, which predict the following token).

* ULD per aligned group: Σ_i |sort(q)_i − sort(p)_i|, the sorted probability vectors zero-padded to the
  larger vocabulary (the closed form of the optimal transport between the two vocabularies' probabilities
  with a uniform cost), summed over groups and divided by their number.
* Hybrid (GOLD): the columns of tokens whose strings both vocabularies hold (:class:`VocabularyMatch`) are
  compared directly with GKD's generalized JSD(β) on the (unnormalised) merged probabilities, the other
  columns with ULD's sorted distance; weights M / V_teacher and 1 − M / V_teacher (M shared tokens) unless
  given.

Differences from TRL, each tested: merged probabilities are formed in log space with no clamp (TRL clamps
each token probability and the JSD's logarithms at 1e-8; equal wherever no probability is below 1e-8).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError, unknown_choice
from kdcollapse.losses._reduce import IGNORE_INDEX
from kdcollapse.losses.llm import _jsd

STRATEGIES = ("bayesian", "observed")
LOSSES = ("uld", "gold")  # ULD alone; GOLD's hybrid (JSD on the shared tokens, ULD on the rest)


@dataclass(frozen=True)
class VocabularyMatch:
    """Tokens whose strings both vocabularies hold: ``teacher_ids`` (M,) ascending and the student's id of
    each, ``student_ids`` (M,); ``teacher_vocab`` is the teacher's vocabulary size."""

    teacher_ids: Tensor
    student_ids: Tensor
    teacher_vocab: int

    @classmethod
    def from_vocabularies(cls, student: Mapping[str, int], teacher: Mapping[str, int]) -> VocabularyMatch:
        """From the two ``{token string: id}`` maps (``tokenizer.get_vocab()``)."""
        pairs = sorted((t, student[s]) for s, t in teacher.items() if s in student)
        ids = torch.tensor(pairs, dtype=torch.long).reshape(-1, 2)
        return cls(ids[:, 0], ids[:, 1], max(teacher.values()) + 1)

    @classmethod
    def from_tokenizers(cls, student: Any, teacher: Any) -> VocabularyMatch:
        return cls.from_vocabularies(student.get_vocab(), teacher.get_vocab())


def tokenize_completion(tokenizer: Any, prompt: str, completion: str) -> tuple[list[int], list[int], list[tuple[int, int]]]:
    """``(input_ids, labels, byte_offsets)`` of ``prompt`` + ``completion`` + end of text, as TRL's GOLD
    builds its teacher inputs: the prompt with the tokenizer's special tokens (a trailing end-of-text
    dropped), the completion without, then the end-of-text token; labels are ``-100`` on the prompt;
    offsets are the completion tokens' UTF-8 byte spans in ``completion`` ((0, 0) on the prompt, (n, n) on
    the end of text, n the completion's byte length): exact from the pieces of a byte-level BPE (SmolLM,
    Llama-3, Qwen, GPT-2), else from the character offsets of a fast tokenizer."""
    eos = tokenizer.eos_token_id
    prompt_ids = list(tokenizer(prompt, add_special_tokens=True)["input_ids"])
    if eos is not None and prompt_ids and prompt_ids[-1] == eos:
        prompt_ids = prompt_ids[:-1]
    completion_ids, spans = token_byte_spans(tokenizer, completion)
    size = len(completion.encode("utf-8"))
    ids = prompt_ids + completion_ids
    offsets = [(0, 0)] * len(prompt_ids) + spans
    if eos is not None:
        ids.append(eos)
        offsets.append((size, size))
    labels = [IGNORE_INDEX] * len(prompt_ids) + ids[len(prompt_ids):]
    return ids, labels, offsets


def token_byte_spans(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """The ids of ``text`` (no special tokens) and each token's UTF-8 byte span (start, end) in it: exact from
    the pieces of a byte-level BPE, else from the character offsets of a fast tokenizer."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = list(encoded["input_ids"])
    spans = _byte_level_spans(tokenizer.convert_ids_to_tokens(ids), len(text.encode("utf-8")))
    if spans is None:  # not byte-level: character offsets turned into byte offsets
        byte_at = [0]
        for char in text:
            byte_at.append(byte_at[-1] + len(char.encode("utf-8")))
        spans = [(byte_at[a], byte_at[b]) for a, b in encoded["offset_mapping"]]
    return ids, spans


def _byte_unicode() -> dict[str, int]:
    """The byte-level BPE alphabet (GPT-2's): printable Latin-1 bytes are their own character, the other
    bytes the characters from U+0100 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(others)}}


_BYTES = _byte_unicode()


def _byte_level_spans(pieces: Sequence[str], size: int) -> list[tuple[int, int]] | None:
    """Exact byte spans of byte-level BPE ``pieces`` (each piece's length in bytes, in order), or None when
    a piece is not in the byte alphabet or the pieces do not add up to the ``size`` bytes of the text (a
    character split over two tokens gets two spans, where character offsets would give both the same)."""
    if not all(char in _BYTES for piece in pieces for char in piece):
        return None
    spans, end = [], 0
    for piece in pieces:
        spans.append((end, end + len(piece)))
        end += len(piece)
    return spans if end == size else None


def align_offsets(student: Sequence[Sequence[int]], teacher: Sequence[Sequence[int]]
                  ) -> tuple[list[list[int]], list[list[int]]]:
    """Groups of student and teacher token positions that cover the same bytes: walk both (start, end)
    lists, advancing the side whose token ends first, and close a group where both ends meet; what is left
    at the end forms a last group (TRL's ``_align_by_byte_offsets``)."""
    s_groups, t_groups = [], []
    s_start = t_start = s = t = 0
    while s < len(student) and t < len(teacher):
        s_end, t_end = student[s][1], teacher[t][1]
        s, t = s + (s_end <= t_end), t + (t_end <= s_end)
        if s_end == t_end:
            s_groups.append(list(range(s_start, s)))
            t_groups.append(list(range(t_start, t)))
            s_start, t_start = s, t
    if s < len(student) or t < len(teacher):
        s_groups.append(list(range(s_start, len(student))))
        t_groups.append(list(range(t_start, len(teacher))))
    return s_groups, t_groups


def merge_groups(log_probs: Tensor, groups: Sequence[Sequence[int]], token_ids: Sequence[int],
                 strategy: str = "bayesian") -> Tensor:
    """(G, V) log of the merged probabilities of ``groups`` (module doc) from the answer rows'
    log-probabilities (T, V) and the answer's tokens (T,): the chain rule in log space."""
    if strategy not in STRATEGIES:
        raise KdcollapseError(unknown_choice("token merge strategy", strategy, STRATEGIES))
    rows = []
    for group in groups:
        base, scalars = (group[-1], group[:-1]) if strategy == "bayesian" else (group[0], group[1:])
        row = log_probs[base]
        for position in scalars:
            row = row + log_probs[position, token_ids[position]]
        rows.append(row)
    return torch.stack(rows)


def _sorted_l1(q: Tensor, p: Tensor) -> Tensor:
    """Σ |sort(q) − sort(p)| over both rows' columns, the shorter zero-padded, summed over rows."""
    width = max(q.shape[-1], p.shape[-1])
    q = F.pad(q.sort(-1, descending=True).values, (0, width - q.shape[-1]))
    p = F.pad(p.sort(-1, descending=True).values, (0, width - p.shape[-1]))
    return (q - p).abs().sum()


def uld_distance(log_q: Tensor, log_p: Tensor) -> Tensor:
    """ULD between aligned rows of log-probabilities (G, V_s) and (G, V_t): the sorted L1 distance of the
    probabilities summed, divided by G."""
    return _sorted_l1(log_q.exp(), log_p.exp()) / log_q.shape[0]


def hybrid_distance(log_q: Tensor, log_p: Tensor, match: VocabularyMatch, beta: float = 0.5,
                    weights: tuple[float, float] | None = None) -> Tensor:
    """GOLD's hybrid between aligned rows of log-probabilities (G, V_s), (G, V_t): ``weights[0]`` × JSD(β)
    on the shared tokens' columns (summed over columns, mean over rows) + ``weights[1]`` ×
    :func:`uld_distance` on the others; ``weights`` None is (M / V_t, 1 − M / V_t)."""
    groups, device = log_q.shape[0], log_q.device
    t_ids, s_ids = match.teacher_ids.to(device), match.student_ids.to(device)
    matched = log_q.new_zeros(())
    if len(t_ids):
        matched = _jsd(log_q[:, s_ids], log_p[:, t_ids], beta).sum() / groups
    t_rest = torch.ones(log_p.shape[-1], dtype=torch.bool, device=device).index_fill(0, t_ids, False)
    s_rest = torch.ones(log_q.shape[-1], dtype=torch.bool, device=device).index_fill(0, s_ids, False)
    unmatched = log_q.new_zeros(())
    if t_rest.any() and s_rest.any():
        unmatched = _sorted_l1(log_q[:, s_rest].exp(), log_p[:, t_rest].exp()) / groups
    if weights is None:
        share = len(t_ids) / max(1, log_p.shape[-1])
        weights = (share, 1.0 - share)
    return weights[0] * matched + weights[1] * unmatched


def _answer(labels: Tensor) -> tuple[int, int]:
    """(first labelled position, number of labelled positions) of one sequence."""
    kept = (labels != IGNORE_INDEX).nonzero().squeeze(1)
    return (int(kept[0]), len(kept)) if len(kept) else (0, 0)


def uld_loss(student_logits: Tensor, teacher_logits: Tensor, student_labels: Tensor, teacher_labels: Tensor,
             student_ids: Tensor, teacher_ids: Tensor, student_offsets: Tensor | None = None,
             teacher_offsets: Tensor | None = None, *, match: VocabularyMatch | None = None,
             strategy: str = "bayesian", student_temperature: float = 1.0, teacher_temperature: float = 1.0,
             skip_student_eos: bool = True, skip_teacher_eos: bool = True, beta: float = 0.5,
             weights: tuple[float, float] | None = None) -> Tensor:
    """ULD (``match`` None) or GOLD's hybrid (``match`` given) between a student and a teacher with different
    tokenizers, the mean over the B sequences (a sequence with no answer counts 0).

    ``*_logits`` (B, T, V) are the models' outputs on their own tokens ``*_ids`` (B, T), *not* shifted;
    ``*_labels`` (B, T) are ``-100`` outside each sequence's one answer span (the completion, as
    :func:`tokenize_completion` makes it), whose last token (the end of text) is left out with
    ``skip_*_eos``; ``*_offsets`` (B, T, 2) are the byte spans of the answer tokens in the completion text.
    With offsets the answers are aligned by :func:`align_offsets` and merged by ``strategy`` (module doc);
    without them, position by position up to the shorter answer (the original ULD)."""
    if strategy not in STRATEGIES:
        raise KdcollapseError(unknown_choice("token merge strategy", strategy, STRATEGIES))
    if (student_offsets is None) != (teacher_offsets is None):
        raise KdcollapseError("give the byte offsets of both sides (aligned by text) or of neither (by position)")
    if student_logits.shape[0] != teacher_logits.shape[0]:
        raise KdcollapseError(f"the student has {student_logits.shape[0]} sequences, the teacher "
                              f"{teacher_logits.shape[0]}: they must be the same texts")
    losses = []
    for i in range(student_logits.shape[0]):
        (s_start, s_size), (t_start, t_size) = _answer(student_labels[i]), _answer(teacher_labels[i])
        s_size, t_size = s_size - skip_student_eos, t_size - skip_teacher_eos
        aligned = student_offsets is not None
        if aligned:
            s_span = student_offsets[i, s_start:s_start + max(s_size, 0)].tolist()
            t_span = teacher_offsets[i, t_start:t_start + max(t_size, 0)].tolist()
        if s_size > 0 and t_size > 0 and strategy == "bayesian" and (s_start == 0 or t_start == 0):
            # no logit predicts an answer that starts the sequence: drop its first group on both sides
            s_groups, t_groups = align_offsets(s_span, t_span) if aligned else ([[0]], [[0]])
            s_drop, t_drop = len(s_groups[0]), len(t_groups[0])
            s_start, s_size, t_start, t_size = s_start + s_drop, s_size - s_drop, t_start + t_drop, t_size - t_drop
            if aligned:
                s_span, t_span = s_span[s_drop:], t_span[t_drop:]
        if s_size <= 0 or t_size <= 0:
            losses.append(student_logits[i].sum() * 0.0)
            continue
        shift = 1 if strategy == "bayesian" else 0  # bayesian: the row that predicts each answer token
        s_rows = student_logits[i, s_start - shift:s_start + s_size - shift]
        t_rows = teacher_logits[i, t_start - shift:t_start + t_size - shift]
        log_q = F.log_softmax(s_rows / student_temperature, -1)
        log_p = F.log_softmax(t_rows / teacher_temperature, -1)
        if aligned:
            s_groups, t_groups = align_offsets(s_span, t_span)
            pairs = [(a, b) for a, b in zip(s_groups, t_groups) if a and b]
            log_q = merge_groups(log_q, [a for a, _ in pairs], student_ids[i, s_start:s_start + s_size].tolist(),
                                 strategy)
            log_p = merge_groups(log_p, [b for _, b in pairs], teacher_ids[i, t_start:t_start + t_size].tolist(),
                                 strategy)
        else:
            length = min(s_size, t_size)
            log_q, log_p = log_q[:length], log_p[:length]
        losses.append(uld_distance(log_q, log_p) if match is None
                      else hybrid_distance(log_q, log_p, match, beta, weights))
    return torch.stack(losses).mean()
