"""Text corpora for language models: documents read from files, split into train / validation / test
by document, tokenized once and cached as one safetensors file per (corpus, tokenizer).

The built-in corpus ``python-docs`` is the reStructuredText source of the Python documentation that
Debian's package ``python3.X-doc`` installs under ``/usr/share/doc/python3.X/html/_sources`` (497
documents, 1.4 M words, about 3 M SmolLM2 tokens for 3.11; PSF License, which allows use and
derivative works). Any directory of ``.txt`` files is a corpus too.

The split rule (stated once, here): a document's split is decided by the SHA-256 of its path relative
to the corpus root, ``int(sha256[:8], 16) % 20``: 0 is ``test``, 1 is ``validation``, the rest
``train`` (5 % / 5 % / 90 % of the documents in expectation). It depends on nothing but the name, so
adding a document never moves another.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from kdcollapse.errors import DataError, KdcollapseError, unknown_choice

SPLITS = ("train", "validation", "test")
PYTHON_DOCS = "python-docs"
_FORMAT = "kdcollapse.token_corpus"
_VERSION = 1


@dataclass(frozen=True)
class Document:
    name: str  # path relative to the corpus root, '/'-separated
    text: str

    @property
    def split(self) -> str:
        return split_of(self.name)


def split_of(name: str) -> str:
    """``test``, ``validation`` or ``train`` for the document ``name`` (the rule in the module doc)."""
    bucket = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 20
    return SPLITS[2] if bucket == 0 else SPLITS[1] if bucket == 1 else SPLITS[0]


def python_docs_root() -> Path:
    """The newest ``/usr/share/doc/python3.X/html/_sources`` (Debian ``python3.X-doc``)."""
    found = sorted(Path("/usr/share/doc").glob("python3.*/html/_sources"),
                   key=lambda p: tuple(int(v) for v in p.parts[-3].removeprefix("python").split(".")
                                       if v.isdigit()))
    if not found:
        raise DataError(f"the corpus {PYTHON_DOCS!r} is the Python documentation of Debian's python3.X-doc "
                        f"package, which is not installed: apt-get install python3-doc "
                        f"(or give a directory of .txt files)")
    return found[-1]


def read_documents(root: str | Path | None = None, pattern: str = "**/*.txt") -> list[Document]:
    """Every file under ``root`` matching ``pattern`` (sorted by path), as UTF-8 text; empty files
    are skipped. ``root`` None or ``"python-docs"`` is the built-in corpus."""
    root = python_docs_root() if root in (None, PYTHON_DOCS) else Path(root)
    if not root.is_dir():
        raise DataError(f"corpus {str(root)!r} is not a directory (give a directory of .txt files or "
                        f"{PYTHON_DOCS!r})")
    docs = []
    for path in sorted(p for p in root.glob(pattern) if p.is_file()):
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise DataError(f"{path} is not UTF-8 text ({err.reason} at byte {err.start})") from None
        if text.strip():
            docs.append(Document(path.relative_to(root).as_posix(), text))
    if not docs:
        raise DataError(f"corpus {str(root)!r} holds no text: no non-empty file matches {pattern!r}")
    return docs


@dataclass(frozen=True)
class TokenSplit:
    """One split's tokens, documents one after the other, each followed by the end-of-text token;
    ``offsets[i]:offsets[i+1]`` are document ``names[i]``."""

    tokens: torch.Tensor  # (N,) int32
    offsets: torch.Tensor  # (D + 1,) int64
    names: tuple[str, ...]

    def blocks(self, block_size: int, prefix: Sequence[int] = ()) -> torch.Tensor:
        """The tokens cut into consecutive non-overlapping rows of ``block_size`` (the tail dropped), each
        starting with ``prefix`` (:func:`cut_blocks`): (n, block_size) int64, ready for a causal LM (labels =
        the inputs); n = N // block_size without a prefix."""
        ids, _ = cut_blocks(self.tokens, torch.ones(self.tokens.shape, dtype=torch.bool), block_size, prefix)
        if len(ids) == 0:
            raise DataError(f"this split has {self.tokens.numel()} tokens, fewer than one block of "
                            f"{block_size}")
        return ids


def cut_blocks(ids: torch.Tensor, targets: torch.Tensor, block_size: int,
               prefix: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """The token stream ``ids`` (N,) and its ``targets`` (N,) bool cut into consecutive rows of ``block_size``,
    the tail shorter than a row dropped: (n, block_size) int64 ids and bool targets. Each row starts with
    ``prefix``, the special tokens the tokenizer puts before a text (its beginning-of-text token:
    :func:`~kdcollapse.lm.leading_specials`): a row whose tokens already start with them (a chat template
    that writes them) takes the next ``block_size`` tokens, any other row gets them added, not counted, before
    its next ``block_size - len(prefix)`` tokens. Without a prefix the rows are the stream viewed as
    (N // block_size, block_size)."""
    prefix = list(prefix)
    _check_block_size(block_size, prefix)
    if not prefix:
        n = ids.numel() // block_size
        return ids[:n * block_size].view(n, block_size).long(), targets[:n * block_size].view(n, block_size).bool()
    stream, p = ids.tolist(), len(prefix)
    starts, added, at = [], [], 0
    while True:
        has = stream[at:at + p] == prefix
        take = block_size if has else block_size - p
        if at + take > len(stream):
            break
        starts.append(at)
        added.append(not has)
        at += take
    starts, added = torch.tensor(starts, dtype=torch.int64), torch.tensor(added, dtype=torch.bool)
    index = starts[:, None] + torch.arange(block_size) - p * added[:, None].long()  # row position -> stream index
    index[added, :p] = 0
    rows, counted = ids.long()[index], targets.bool()[index]
    rows[added, :p] = torch.tensor(prefix, dtype=torch.int64)
    counted[added, :p] = False
    return rows, counted


def _check_block_size(block_size: int, prefix: Sequence[int] = ()) -> None:
    if not (isinstance(block_size, int) and block_size >= 2):
        raise KdcollapseError(f"block_size must be an int >= 2, got {block_size!r}")
    if block_size <= len(prefix):
        raise KdcollapseError(f"block_size {block_size} leaves no room after the tokenizer's {len(prefix)} "
                              f"leading special token(s)")


@dataclass(frozen=True)
class TokenCorpus:
    """A corpus tokenized once: ``splits[name]`` for train, validation and test."""

    splits: dict[str, TokenSplit]
    key: str  # SHA-256 of the documents, the split rule and the tokenizer

    def __getitem__(self, split: str) -> TokenSplit:
        if split not in self.splits:
            raise KdcollapseError(unknown_choice("split", split, self.splits))
        return self.splits[split]

    def summary(self) -> dict[str, dict[str, int]]:
        return {name: {"documents": len(s.names), "tokens": int(s.tokens.numel())}
                for name, s in self.splits.items()}


def tokenize_corpus(tokenizer: Any, root: str | Path | None = None, *, pattern: str = "**/*.txt",
                    cache_dir: str | Path | None = None) -> TokenCorpus:
    """The documents of ``root`` tokenized with ``tokenizer`` (a ``transformers`` tokenizer), split by
    document, and cached under ``cache_dir`` (default ``$KDCOLLAPSE_CACHE`` or
    ``~/.cache/kdcollapse``) as ``corpus-<key>.safetensors``; a second call reads the cache."""
    docs = read_documents(root, pattern)
    key = _corpus_key(docs, tokenizer)
    path = _cache_dir(cache_dir) / f"corpus-{key[:16]}.safetensors"
    cached = _read_cache(path, key)
    if cached is not None:
        return cached
    eos = tokenizer.eos_token_id
    if eos is None:
        raise KdcollapseError("the tokenizer has no end-of-text token (eos_token_id) to separate documents")
    splits = {}
    for split in SPLITS:
        chosen = [d for d in docs if d.split == split]
        ids = tokenizer([d.text for d in chosen], add_special_tokens=False)["input_ids"] if chosen else []
        splits[split] = _pack(chosen, ids, eos)
    corpus = TokenCorpus(splits, key)
    _write_cache(path, corpus)
    return corpus


def _pack(docs: Sequence[Document], ids: Sequence[Sequence[int]], eos: int) -> TokenSplit:
    lengths = [len(t) + 1 for t in ids]
    offsets = torch.zeros(len(docs) + 1, dtype=torch.int64)
    offsets[1:] = torch.tensor(lengths, dtype=torch.int64).cumsum(0) if lengths else offsets[1:]
    flat = [token for t in ids for token in (*t, eos)]
    return TokenSplit(torch.tensor(flat, dtype=torch.int32), offsets, tuple(d.name for d in docs))


def _corpus_key(docs: Sequence[Document], tokenizer: Any) -> str:
    h = hashlib.sha256(f"{_FORMAT} {_VERSION}\n".encode())
    for doc in docs:
        h.update(doc.name.encode() + b"\0" + hashlib.sha256(doc.text.encode()).digest())
    backend = getattr(tokenizer, "backend_tokenizer", None)
    h.update((backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(),
                                                                        sort_keys=True)).encode())
    h.update(str(tokenizer.eos_token_id).encode())
    return h.hexdigest()


def _cache_dir(cache_dir: str | Path | None) -> Path:
    if cache_dir is None:
        cache_dir = os.environ.get("KDCOLLAPSE_CACHE") or Path.home() / ".cache" / "kdcollapse"
    path = Path(cache_dir)
    path.mkdir(parents=True, exist_ok=True)
    return path


def _write_cache(path: Path, corpus: TokenCorpus) -> None:
    tensors, names = {}, {}
    for split, s in corpus.splits.items():
        tensors[f"{split}.tokens"], tensors[f"{split}.offsets"] = s.tokens, s.offsets
        names[split] = list(s.names)
    meta = {"format": _FORMAT, "version": str(_VERSION), "key": corpus.key, "names": json.dumps(names)}
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata=meta)
        os.replace(tmp, path)
    finally:
        Path(tmp).unlink(missing_ok=True)


def _read_cache(path: Path, key: str) -> TokenCorpus | None:
    """The cached corpus, or None when absent, unreadable or made from other documents/tokenizer."""
    if not path.is_file():
        return None
    try:
        with safe_open(str(path), "pt") as f:
            meta = f.metadata() or {}
        if meta.get("format") != _FORMAT or meta.get("key") != key:
            return None
        tensors, names = load_file(str(path)), json.loads(meta["names"])
    except (SafetensorError, OSError, ValueError, KeyError):
        return None
    splits = {split: TokenSplit(tensors[f"{split}.tokens"], tensors[f"{split}.offsets"], tuple(names[split]))
              for split in SPLITS}
    return TokenCorpus(splits, key)
