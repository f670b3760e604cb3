"""Rows of text tokenized by two tokenizers, the student's and the teacher's, cut at the same bytes: the data of a
distillation across tokenizers (ULD, GOLD: :mod:`kdcollapse.losses.cross_tokenizer`).

Each example is tokenized by both tokenizers, segment by segment as :func:`~kdcollapse.lm.tokenize_example` does
(a text document; a string prompt, then its completion), with the end-of-text token after it, and every token keeps
the UTF-8 byte span it covers (:func:`~kdcollapse.losses.cross_tokenizer.token_byte_spans`; the end-of-text token
has the empty span at the end). :func:`~kdcollapse.losses.cross_tokenizer.align_offsets` groups the two token
lists where both reach the same byte; a row is a run of whole groups holding at most ``block_size`` tokens on
each side, so the student's row and the teacher's row hold the same text. Rows never span two examples (a row has
one answer span, as the losses need). ``layout``: ``pack`` keeps every row of an example (a long document gives
several), ``pad`` its first row only (a longer example is counted as truncated). A group longer than
``block_size`` on one side is dropped and the row cut there. Each side is padded on the right to ``block_size``
with its pad token (else end-of-text), never counted; offsets are relative to the row's first byte. A tokenizer
that puts special tokens before a text (a beginning-of-text token: Gemma, Llama) gets them at the start of each
of its rows, not counted and of empty span (:func:`~kdcollapse.lm.leading_specials`; as TRL's GOLD tokenizes its
prompts, and as the one-tokenizer rows get them: :mod:`kdcollapse.lm._blocks`).

A token counts (``targets``) as in the one-tokenizer data: every token of a text document, the completion and the
end-of-text token of a prompt/completion pair (``loss_on=all``: the prompt too). Chat conversations are refused:
each tokenizer renders them with its own template, so the two texts differ and no byte alignment exists.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kdcollapse.errors import DataError, KdcollapseError, unknown_choice
from kdcollapse.lm._blocks import LAYOUTS
from kdcollapse.lm._corpus import SPLITS
from kdcollapse.lm._examples import LOSS_ON, Example, leading_specials
from kdcollapse.losses.cross_tokenizer import align_offsets, token_byte_spans


@dataclass(frozen=True)
class PairedSide:
    """One tokenizer's rows: ``ids`` (n, T) int64, ``targets`` (n, T) bool (token j is a training target) and
    ``offsets`` (n, T, 2) int64, each token's byte span in its row's text (padding: (0, 0))."""

    ids: torch.Tensor
    targets: torch.Tensor
    offsets: torch.Tensor

    def select(self, index: torch.Tensor) -> PairedSide:
        return PairedSide(self.ids[index], self.targets[index], self.offsets[index])

    def labels(self) -> torch.Tensor:
        """``ids`` where counted, ``-100`` elsewhere (the losses' labels)."""
        return torch.where(self.targets, self.ids, torch.full_like(self.ids, -100))

    def predicted_bytes(self) -> torch.Tensor:
        """(n, T - 1): the bytes that the prediction at position j brings in, the text from token j's end to
        token j + 1's end, where token j + 1 counts (0 elsewhere); a row's sum is the text its loss predicts."""
        ends = self.offsets[..., 1]
        return torch.where(self.targets[:, 1:], ends[:, 1:] - ends[:, :-1], torch.zeros_like(ends[:, 1:]))


@dataclass(frozen=True)
class PairedBlocks:
    """The student's and the teacher's rows of one split (row i of both holds the same text)."""

    student: PairedSide
    teacher: PairedSide
    examples: int
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.student.ids)

    def select(self, index: torch.Tensor) -> PairedBlocks:
        return PairedBlocks(self.student.select(index), self.teacher.select(index), self.examples, self.truncated)


def _segments(example: Example, loss_on: str) -> list[tuple[str, bool]]:
    if example.kind == "text":
        return [(example.text, True)]
    if example.kind == "prompt_completion" and isinstance(example.prompt, str):
        return [(example.prompt, loss_on == "all"), (example.completion, True)]
    raise DataError("distillation across tokenizers takes text and string prompt/completion examples: a "
                    "conversation is rendered by each tokenizer's own chat template, so the two texts differ; "
                    "give the data as prompt/completion strings")


def _tokenize(tokenizer: Any, segments: Sequence[tuple[str, bool]]) -> tuple[list[int], list[bool], list[tuple[int, int]]]:
    ids, counted, spans, base = [], [], [], 0
    for text, count in segments:
        part, part_spans = token_byte_spans(tokenizer, text)
        ids += part
        counted += [count] * len(part)
        spans += [(base + a, base + b) for a, b in part_spans]
        base += len(text.encode("utf-8"))
    ids.append(tokenizer.eos_token_id)
    counted.append(True)
    spans.append((base, base))
    return ids, counted, spans


def _rows(s_groups: list[list[int]], t_groups: list[list[int]], limits: tuple[int, int]) -> list[tuple[int, int, int, int]]:
    """(student start, stop, teacher start, stop) of each row: runs of whole groups, at most ``limits`` tokens
    on each side (module doc)."""
    rows, start = [], None
    s_count = t_count = 0
    s_limit, t_limit = limits
    for s, t in zip(s_groups, t_groups):
        if not s or not t or len(s) > s_limit or len(t) > t_limit:  # no shared cut inside: drop it
            if start is not None:
                rows.append((start[0], s_end, start[1], t_end))
            start = None
            continue
        if start is not None and (s_count + len(s) > s_limit or t_count + len(t) > t_limit):
            rows.append((start[0], s_end, start[1], t_end))
            start = None
        if start is None:
            start, s_count, t_count = (s[0], t[0]), 0, 0
        s_count, t_count, s_end, t_end = s_count + len(s), t_count + len(t), s[-1] + 1, t[-1] + 1
    if start is not None:
        rows.append((start[0], s_end, start[1], t_end))
    return rows


def paired_blocks(student_tokenizer: Any, teacher_tokenizer: Any, examples: Sequence[Example], block_size: int, *,
                  layout: str = "pack", loss_on: str = "completion") -> dict[str, PairedBlocks]:
    """The rows of every split of ``examples`` (module doc); a split with no row that counts a token after its
    first on both sides is absent."""
    if layout not in LAYOUTS:
        raise KdcollapseError(unknown_choice("layout", layout, LAYOUTS))
    if loss_on not in LOSS_ON:
        raise KdcollapseError(unknown_choice("loss_on", loss_on, LOSS_ON))
    if not (isinstance(block_size, int) and block_size >= 2):
        raise KdcollapseError(f"block_size must be an int >= 2, got {block_size!r}")
    sides = {"student": student_tokenizer, "teacher": teacher_tokenizer}
    pads = {}
    for role, tokenizer in sides.items():
        if tokenizer.eos_token_id is None:
            raise KdcollapseError(f"the {role}'s tokenizer has no end-of-text token (eos_token_id) to end examples")
        pads[role] = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    prefix = {role: leading_specials(tokenizer) for role, tokenizer in sides.items()}
    limits = (block_size - len(prefix["student"]), block_size - len(prefix["teacher"]))
    if min(limits) < 1:
        raise KdcollapseError(f"block_size {block_size} leaves no room after the tokenizers' leading special tokens")
    out = {}
    for split in SPLITS:
        rows = {"student": [], "teacher": []}
        chosen = truncated = 0
        for example in (e for e in examples if e.split == split):
            segments = _segments(example, loss_on)
            tokens = {"student": _tokenize(student_tokenizer, segments), "teacher": _tokenize(teacher_tokenizer, segments)}
            cuts = _rows(*align_offsets(tokens["student"][2], tokens["teacher"][2]), limits)
            if layout == "pad":  # the example's first row, where it starts
                truncated += len(cuts) > 1
                cuts = cuts[:1]
            made = []
            for cut in cuts:  # each side's row: its leading special tokens (not counted), then the row's tokens
                row = {}
                for role, (lo, hi) in (("student", cut[:2]), ("teacher", cut[2:])):
                    ids, counted, spans = tokens[role]
                    first = spans[lo - 1][1] if lo else 0  # the row starts where the previous group ended
                    head = prefix[role]
                    row[role] = (head + ids[lo:hi], [False] * len(head) + counted[lo:hi],
                                 [(0, 0)] * len(head) + [(a - first, b - first) for a, b in spans[lo:hi]])
                if all(any(row[role][1][1:]) for role in sides):  # a prediction counts on both sides
                    made.append(row)
            chosen += bool(made)
            for row in made:
                for role in sides:
                    rows[role].append(row[role])
        if rows["student"]:
            out[split] = PairedBlocks(*(_pad(rows[role], block_size, pads[role]) for role in sides), chosen, truncated)
    if "train" not in out:
        raise DataError(f"the training split holds no row of at most {block_size} tokens with a counted token")
    return out


def _pad(rows: list[tuple[list[int], list[bool], list[tuple[int, int]]]], block_size: int, pad_id: int) -> PairedSide:
    ids = torch.full((len(rows), block_size), pad_id, dtype=torch.int64)
    targets = torch.zeros(len(rows), block_size, dtype=torch.bool)
    offsets = torch.zeros(len(rows), block_size, 2, dtype=torch.int64)
    for i, (row_ids, row_counted, row_spans) in enumerate(rows):
        ids[i, :len(row_ids)] = torch.tensor(row_ids, dtype=torch.int64)
        targets[i, :len(row_ids)] = torch.tensor(row_counted, dtype=torch.bool)
        offsets[i, :len(row_ids)] = torch.tensor(row_spans, dtype=torch.int64).reshape(-1, 2)
    return PairedSide(ids, targets, offsets)
