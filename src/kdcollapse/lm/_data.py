"""The ``data`` section of a language-model run: where the examples come from, what kind they are, which tokens
the loss counts and how they are laid out in blocks; and the blocks of each split it gives.

``source`` ``null`` (or ``python-docs``) is the built-in corpus; a directory of ``.txt`` files is a text corpus as
before (tokenized once and cached: ``tokenize_corpus``); anything else is a ``datasets`` source read by
:func:`~kdcollapse.lm.read_examples`. Layouts and masks: ``kdcollapse.lm._blocks``.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from kdcollapse.errors import ConfigError
from kdcollapse.lm._blocks import LAYOUTS, TokenBlocks, example_blocks
from kdcollapse.lm._corpus import PYTHON_DOCS, cut_blocks, tokenize_corpus
from kdcollapse.lm._examples import (DATA_FORMATS, LOSS_ON, DataFields, is_dataset_source, leading_specials,
                                     read_examples)


@dataclass
class DataSpec:
    """``data:`` of a language-model run (YAML keys, each checked before anything loads)."""

    source: str | None = None  # null / "python-docs", a folder of .txt files, a dataset directory or data file
    format: str = "auto"  # auto | text | prompt_completion | chat (auto: from the columns)
    loss_on: str = "completion"  # completion: the completion / assistant tokens only; all: every token
    layout: str = "pack"  # pack: examples concatenated and cut into blocks; pad: one example per block
    fields: dict = field(default_factory=dict)  # column names: text, prompt, completion, messages

    def __post_init__(self):
        for key, value, choices in (("format", self.format, DATA_FORMATS), ("loss_on", self.loss_on, LOSS_ON),
                                    ("layout", self.layout, LAYOUTS)):
            if value not in choices:
                raise ConfigError(f"data.{key} must be one of {', '.join(choices)}; got {value!r}")
        if self.source is not None and not isinstance(self.source, str):
            raise ConfigError(f"data.source must be a path or null (the built-in corpus), got {self.source!r}")
        known = set(DataFields.__dataclass_fields__)
        if not isinstance(self.fields, dict) or set(self.fields) - known or not all(
                isinstance(v, str) for v in self.fields.values()):
            raise ConfigError(f"data.fields maps {', '.join(sorted(known))} to column names (strings); got "
                              f"{self.fields!r}")

    @property
    def text_corpus(self) -> bool:
        """Whether the source is the built-in corpus or a folder of text files (read as today, cached)."""
        if self.source in (None, PYTHON_DOCS):
            return True
        path = Path(self.source)
        return path.is_dir() and not is_dataset_source(path)


def data_blocks(tokenizer: Any, spec: DataSpec, block_size: int, *,
                cache_dir: str | Path | None = None) -> tuple[dict[str, TokenBlocks], str]:
    """The blocks of every split ``spec`` gives, and a key naming the data (the corpus key for a text corpus, the
    SHA-256 of the training blocks and masks otherwise), for caches keyed by the data."""
    if spec.text_corpus and spec.format in ("auto", "text"):
        corpus = tokenize_corpus(tokenizer, spec.source, cache_dir=cache_dir)
        prefix = leading_specials(tokenizer)  # each row starts with them, not counted (kdcollapse.lm._blocks)
        out = {}
        for split, tokens in corpus.splits.items():
            ids, targets = cut_blocks(tokens.tokens, torch.ones(tokens.tokens.shape, dtype=torch.bool), block_size,
                                      prefix)
            if len(ids):
                out[split] = TokenBlocks(ids, targets, len(tokens.names))
        return out, corpus.key
    examples = read_examples(spec.source, format=spec.format, fields=DataFields(**spec.fields))
    blocks = example_blocks(tokenizer, examples, block_size, layout=spec.layout, loss_on=spec.loss_on)
    digest = hashlib.sha256()
    for split in sorted(blocks):
        digest.update(split.encode() + blocks[split].ids.numpy().tobytes() + blocks[split].targets.numpy().tobytes())
    return blocks, digest.hexdigest()
