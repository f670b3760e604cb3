"""Tokenized examples laid out as fixed-length blocks for a causal LM, with the mask of the tokens the loss counts.

Two layouts (``layout``):

- ``pack``: the examples of a split, one after the other in the order read, form one token stream cut into
  consecutive rows of ``block_size`` (the tail shorter than a block dropped), as ``TokenSplit.blocks`` does for a
  text corpus. An example may run across two rows. Document boundaries: a text document and a string
  prompt/completion pair end with the end-of-text token, a rendered conversation with its template's end-of-turn
  markup; attention is not reset at a boundary (a token may attend to the previous example in its row, as in
  GPT-2's pre-training), and the first token of an example is predicted from the example before it only where
  the mask counts it (never for chat and prompt/completion data with ``loss_on=completion``: their first token is
  prompt).
- ``pad``: one example per row, its first ``block_size`` tokens (a longer one is cut; how many were is reported),
  padded on the right with the pad token (else the end-of-text token), the padding never counted. Right padding
  needs no attention mask for a causal model: a real token never attends to a later position, so its logits are
  those of the unpadded example.

In both layouts a row starts as the model saw a text in training: with the special tokens its tokenizer puts
before a text (a beginning-of-text token: Gemma's, Llama's; none for SmolLM2's or GPT-2's, whose rows are as
before: :func:`~kdcollapse.lm.leading_specials`), added, not counted, inside ``block_size`` (as the rows across
tokenizers get them, :mod:`kdcollapse.lm._paired`), unless the row's tokens already start with them (a chat
template that writes them): :func:`~kdcollapse.lm.cut_blocks`.

``targets[i, j]`` says whether token j of row i is a training target; the loss of the prediction made at
position j - 1 counts iff ``targets[i, j]`` (``loss_mask`` gives that shifted (n, T - 1) mask).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kdcollapse.errors import DataError, KdcollapseError, unknown_choice
from kdcollapse.lm._corpus import SPLITS, _check_block_size, cut_blocks
from kdcollapse.lm._examples import LOSS_ON, Example, leading_specials, tokenize_example

LAYOUTS = ("pack", "pad")


@dataclass(frozen=True)
class TokenBlocks:
    """``ids`` (n, T) int64 and ``targets`` (n, T) bool (module doc); ``truncated``: examples cut to fit a padded
    row; ``examples``: how many examples the rows hold."""

    ids: torch.Tensor
    targets: torch.Tensor
    examples: int
    truncated: int = 0

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def loss_mask(self) -> torch.Tensor:
        """(n, T - 1) bool: position j's prediction of token j + 1 counts."""
        return self.targets[:, 1:]

    def select(self, index: torch.Tensor) -> TokenBlocks:
        return TokenBlocks(self.ids[index], self.targets[index], self.examples, self.truncated)


def pack_examples(tokenized: Sequence[tuple[Sequence[int], Sequence[bool]]], block_size: int,
                  prefix: Sequence[int] = ()) -> TokenBlocks:
    """The ``pack`` layout of the module doc; ``prefix``: the tokenizer's leading special tokens."""
    _check_block_size(block_size, prefix)
    ids = torch.tensor([t for example, _ in tokenized for t in example], dtype=torch.int64)
    targets = torch.tensor([m for _, mask in tokenized for m in mask], dtype=torch.bool)
    rows, counted = cut_blocks(ids, targets, block_size, prefix)
    if len(rows) == 0:
        raise DataError(f"these examples hold {len(ids)} tokens, fewer than one block of {block_size}")
    return TokenBlocks(rows, counted, len(tokenized))


def _headed(ids: Sequence[int], mask: Sequence[bool], prefix: Sequence[int]) -> tuple[list[int], list[bool]]:
    """An example's tokens and mask as its padded row starts: after ``prefix``, not counted, unless they start
    with it."""
    ids, mask, prefix = list(ids), list(mask), list(prefix)
    if ids[:len(prefix)] == prefix:
        return ids, mask
    return prefix + ids, [False] * len(prefix) + mask


def pad_examples(tokenized: Sequence[tuple[Sequence[int], Sequence[bool]]], block_size: int,
                 pad_id: int, prefix: Sequence[int] = ()) -> TokenBlocks:
    """The ``pad`` layout of the module doc; ``prefix``: the tokenizer's leading special tokens."""
    _check_block_size(block_size, prefix)
    if not tokenized:
        raise DataError("no examples to pad into blocks")
    ids = torch.full((len(tokenized), block_size), pad_id, dtype=torch.int64)
    targets = torch.zeros(len(tokenized), block_size, dtype=torch.bool)
    truncated = 0
    for row, (example, mask) in enumerate(tokenized):
        example, mask = _headed(example, mask, prefix)
        length = min(len(example), block_size)
        truncated += len(example) > block_size
        ids[row, :length] = torch.tensor(list(example[:length]), dtype=torch.int64)
        targets[row, :length] = torch.tensor(list(mask[:length]), dtype=torch.bool)
    return TokenBlocks(ids, targets, len(tokenized), truncated)


def example_blocks(tokenizer: Any, examples: Sequence[Example], block_size: int, *, layout: str = "pack",
                   loss_on: str = "completion") -> dict[str, TokenBlocks]:
    """``examples`` tokenized (``tokenize_example``), split by their names' rule and laid out per split; a split
    with no example, or too few tokens for one packed block, is absent."""
    if layout not in LAYOUTS:
        raise KdcollapseError(unknown_choice("layout", layout, LAYOUTS))
    if loss_on not in LOSS_ON:
        raise KdcollapseError(unknown_choice("loss_on", loss_on, LOSS_ON))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    if pad_id is None:
        raise KdcollapseError("the tokenizer has neither a pad nor an end-of-text token")
    prefix = leading_specials(tokenizer)
    _check_block_size(block_size, prefix)
    out = {}
    for split in SPLITS:
        chosen = [tokenize_example(tokenizer, e, loss_on=loss_on) for e in examples if e.split == split]
        # an example with no counted token after its first (in a padded row: after the row's first) is dropped
        chosen = [(ids, mask) for ids, mask in chosen
                  if any(_headed(ids, mask, prefix)[1][1:block_size] if layout == "pad" else mask[1:])]
        if not chosen:
            continue
        try:
            out[split] = (pack_examples(chosen, block_size, prefix) if layout == "pack"
                          else pad_examples(chosen, block_size, pad_id, prefix))
        except DataError:
            continue
    if "train" not in out:
        raise DataError(f"the training split holds no block of {block_size} tokens with a counted token")
    return out
