"""A byte-level BPE tokenizer trained on one split of a corpus: the student's own tokenizer of a distillation across
tokenizers (``distill-lm`` with ``student_tokenizer``), trained on the training documents only so that no
validation or test text shapes it.

The documents are those of :func:`kdcollapse.lm.read_documents` (sorted by path) whose split
(:func:`kdcollapse.lm.split_of`) is the one asked for, fed in that order to ``tokenizers``' byte-level BPE trainer
(GPT-2's byte alphabet, so every string encodes; ``<|endoftext|>`` the one special token, id 0, end of text and
padding). BPE training draws nothing at random: the merges are a function of the texts and the vocabulary size,
so the same corpus gives the same files, byte for byte (tested). The directory is a Hugging Face tokenizer
(``save_pretrained``: ``AutoTokenizer`` and :func:`kdcollapse.lm.load_tokenizer` open it) with
``kdcollapse_tokenizer.json`` beside it: the corpus, split, document count, vocabulary size and the SHA-256 of
the training text.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path

from kdcollapse._optional import require
from kdcollapse.errors import ConfigError, DataError, unknown_choice
from kdcollapse.lm._corpus import PYTHON_DOCS, SPLITS, read_documents, split_of

EOS = "<|endoftext|>"
MANIFEST = "kdcollapse_tokenizer.json"
MIN_VOCAB = 257  # the 256 byte symbols and the end-of-text token


def train_bpe_tokenizer(out: str | Path, vocab_size: int, corpus: str | Path = PYTHON_DOCS, *, split: str = "train",
                        min_frequency: int = 2, overwrite: bool = False) -> dict:
    """Train a byte-level BPE of ``vocab_size`` tokens on the ``split`` documents of ``corpus`` (a directory of
    ``.txt`` files or ``"python-docs"``) and save it in ``out`` (module doc); returns the manifest. Bad arguments
    and an existing ``out`` (without ``overwrite``) are refused before anything is written."""
    if not (isinstance(vocab_size, int) and not isinstance(vocab_size, bool) and vocab_size >= MIN_VOCAB):
        raise ConfigError(f"vocab_size must be an int >= {MIN_VOCAB} (256 bytes and {EOS}), got {vocab_size!r}")
    if not (isinstance(min_frequency, int) and min_frequency >= 1):
        raise ConfigError(f"min_frequency must be a positive int, got {min_frequency!r}")
    if split not in SPLITS:
        raise ConfigError(unknown_choice("split", split, SPLITS))
    out = Path(out)
    if out.exists() and not overwrite and (not out.is_dir() or any(out.iterdir())):
        raise ConfigError(f"{out} exists and is not empty: give another directory, or overwrite=True "
                          "(--overwrite) to replace it")
    docs = [d for d in read_documents(corpus) if split_of(d.name) == split]
    if not docs:
        raise DataError(f"corpus {str(corpus)!r} has no document in the {split} split")
    tokenizers = require("tokenizers", "training a tokenizer")
    transformers = require("transformers", "training a tokenizer")
    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator((d.text for d in docs), vocab_size=vocab_size, min_frequency=min_frequency,
                            special_tokens=[EOS], show_progress=False)
    tokenizer = transformers.PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token=EOS, pad_token=EOS)
    digest = hashlib.sha256()
    for d in docs:
        digest.update(d.name.encode() + b"\0" + d.text.encode() + b"\0")
    manifest = {"format": "kdcollapse.bpe_tokenizer", "kind": "byte-level BPE", "corpus": str(corpus),
                "split": split, "documents": len(docs), "vocab_size": vocab_size, "tokens": len(tokenizer),
                "min_frequency": min_frequency, "text_sha256": digest.hexdigest(),
                "tokenizers": tokenizers.__version__}
    tmp = out.with_name(f".{out.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tokenizer.save_pretrained(tmp)
    (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    if out.exists():
        shutil.rmtree(out)
    os.replace(tmp, out)
    return manifest
