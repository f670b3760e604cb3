"""Training examples for a language model, read from a text folder or a Hugging Face ``datasets`` source, and
tokenized with a mask of the tokens the loss counts.

Three kinds of example (``Example.kind``):

- ``text``: a document; every token counts.
- ``prompt_completion``: a prompt and its completion. Strings are tokenized apart and joined (prompt tokens, then
  completion tokens, then the end-of-text token), so the boundary is exact; lists of chat messages
  (``[{"role": ..., "content": ...}]``) are rendered with the tokenizer's chat template as one conversation, the
  completion's messages being the assistant's reply.
- ``chat``: a conversation (``messages``), rendered with the tokenizer's chat template; the assistant's turns are
  the completion.

The completion of a rendered conversation, stated once: for the assistant message i, its span of the rendered text
runs from the end of ``render(messages[:i], add_generation_prompt=True)`` to the end of
``render(messages[:i + 1])`` (the reply and the end-of-turn markup the template writes after it, as TRL's
``assistant_only_loss`` counts). A template that does not render each conversation as a prefix of the next
(``render(messages[:i + 1])`` not starting with the prefix) is refused. A token counts when its characters
overlap a completion span. ``loss_on="all"`` counts every token instead.

The split of an example is the split rule of ``kdcollapse.lm._corpus`` applied to its name: the file's path for a
text document, ``sha256:<SHA-256 of the example's fields as sorted JSON>`` for a dataset row, so a row's split
depends on its content only (identical rows share a split; adding or reordering rows moves no other).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kdcollapse._optional import require
from kdcollapse.errors import DataError, KdcollapseError, unknown_choice
from kdcollapse.lm._corpus import read_documents, split_of

KINDS = ("text", "prompt_completion", "chat")
DATA_FORMATS = ("auto", *KINDS)
LOSS_ON = ("completion", "all")
_DATASET_FILES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".arrow": "arrow"}


@dataclass(frozen=True)
class Example:
    """One training example: ``text``, or ``prompt`` and ``completion`` (strings or message lists), or
    ``messages``."""

    name: str
    kind: str
    text: str | None = None
    prompt: Any = None
    completion: Any = None
    messages: tuple | None = None

    @property
    def split(self) -> str:
        return split_of(self.name)


@dataclass(frozen=True)
class DataFields:
    """The dataset columns each kind reads (TRL's names by default)."""

    text: str = "text"
    prompt: str = "prompt"
    completion: str = "completion"
    messages: str = "messages"


def read_examples(source: str | Path | None, *, format: str = "auto", fields: DataFields = DataFields(),
                  pattern: str = "**/*.txt") -> list[Example]:
    """The examples of ``source``: a directory of ``.txt`` files (or ``None`` / ``"python-docs"``, the built-in
    corpus), a directory written by ``datasets``' ``save_to_disk``, a ``.jsonl`` / ``.json`` / ``.parquet`` /
    ``.arrow`` file, or a directory of such files (all of one type). ``format`` ``auto`` takes the kind from the
    columns: ``messages`` → chat, ``prompt`` and ``completion`` → prompt_completion, ``text`` → text."""
    if format not in DATA_FORMATS:
        raise KdcollapseError(unknown_choice("data format", format, DATA_FORMATS))
    path = None if source is None else Path(source)
    files = _dataset_files(path) if path is not None else []
    if path is None or (path.is_dir() and not files and not _is_saved_dataset(path)):
        if format not in ("auto", "text"):
            raise DataError(f"{source} is a folder of text files: it holds no {format} examples (give a dataset "
                            f"directory or a .jsonl/.parquet/.arrow file)")
        return [Example(d.name, "text", text=d.text) for d in read_documents(source, pattern)]
    rows, columns = _read_rows(path, files)
    kind = _kind(format, columns, fields, path)
    examples = [_example(row, kind, fields, path, i) for i, row in enumerate(rows)]
    if not examples:
        raise DataError(f"{path} holds no rows")
    return examples


def is_dataset_source(path: Path) -> bool:
    """Whether ``path`` is read by ``datasets`` (a saved dataset, a data file, a folder holding data files)
    rather than as a folder of text files."""
    return path.is_file() or _is_saved_dataset(path) or bool(_dataset_files(path))


def _dataset_files(path: Path) -> list[Path]:
    if path.is_file():
        if path.suffix not in _DATASET_FILES:
            raise DataError(f"{path}: a data file is one of {', '.join(_DATASET_FILES)} (or give a directory)")
        return [path]
    if not path.is_dir():
        raise DataError(f"data source {str(path)!r} does not exist (give a text folder, a dataset directory saved "
                        f"by save_to_disk, or a .jsonl/.json/.parquet/.arrow file)")
    if _is_saved_dataset(path):
        return []
    found = sorted(p for p in path.rglob("*") if p.is_file() and p.suffix in _DATASET_FILES)
    suffixes = {_DATASET_FILES[p.suffix] for p in found}
    if len(suffixes) > 1:
        raise DataError(f"{path} mixes data files of types {sorted(suffixes)}: give one type per source")
    return found


def _is_saved_dataset(path: Path) -> bool:
    """A ``save_to_disk`` directory: a Dataset (``dataset_info.json`` + ``state.json``) or a DatasetDict
    (``dataset_dict.json``)."""
    return (path / "dataset_dict.json").is_file() or (path / "state.json").is_file()


def _read_rows(path: Path, files: list[Path]) -> tuple[list[dict], list[str]]:
    datasets = require("datasets", "Hugging Face datasets sources")
    bars = not datasets.are_progress_bars_disabled()
    datasets.disable_progress_bars()  # "Generating train split" for a local file is noise
    try:
        if not files:
            loaded = datasets.load_from_disk(str(path), keep_in_memory=True)
            parts = list(loaded.values()) if isinstance(loaded, datasets.DatasetDict) else [loaded]
        else:
            builder = _DATASET_FILES[files[0].suffix]
            with _offline(), tempfile.TemporaryDirectory(prefix="kdcollapse-datasets-") as scratch:
                loaded = datasets.load_dataset(builder, data_files=[str(f) for f in files], split="train",
                                               keep_in_memory=True, cache_dir=scratch)  # nothing left on disk
            parts = [loaded]
    except KdcollapseError:
        raise
    except Exception as err:  # noqa: BLE001 - datasets and pyarrow raise their own classes for malformed files
        first = (str(err).strip().splitlines() or [""])[0][:200]
        raise DataError(f"cannot read the dataset {path}: {type(err).__name__}: {first}") from None
    finally:
        if bars:
            datasets.enable_progress_bars()
    columns = list(parts[0].column_names)
    for part in parts[1:]:
        if list(part.column_names) != columns:
            raise DataError(f"the splits of {path} have different columns: {columns} and {part.column_names}")
    return [row for part in parts for row in part], columns


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """``datasets`` with the hub switched off while it reads local files."""
    before = os.environ.get("HF_DATASETS_OFFLINE")
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("HF_DATASETS_OFFLINE", None)
        else:
            os.environ["HF_DATASETS_OFFLINE"] = before


def _kind(format: str, columns: Sequence[str], fields: DataFields, path: Path) -> str:
    has = set(columns)
    needs = {"chat": [fields.messages], "prompt_completion": [fields.prompt, fields.completion],
             "text": [fields.text]}
    if format == "auto":
        for kind in ("chat", "prompt_completion", "text"):
            if set(needs[kind]) <= has:
                return kind
        raise DataError(f"{path} has columns {sorted(has)}: none of {fields.messages!r} (chat), "
                        f"{fields.prompt!r} + {fields.completion!r} (prompt_completion) or {fields.text!r} (text); "
                        f"name the columns with data.fields")
    missing = [c for c in needs[format] if c not in has]
    if missing:
        raise DataError(f"{path}: format {format} needs the column(s) {missing}; it has {sorted(has)}")
    return format


def _example(row: Mapping[str, Any], kind: str, fields: DataFields, path: Path, index: int) -> Example:
    where = f"{path} row {index}"
    if kind == "text":
        text = row[fields.text]
        if not isinstance(text, str):
            raise DataError(f"{where}: {fields.text!r} must be a string, got {type(text).__name__}")
        return Example(_row_name([text]), kind, text=text)
    if kind == "chat":
        messages = _messages(row[fields.messages], where, fields.messages)
        return Example(_row_name([messages]), kind, messages=messages)
    prompt, completion = row[fields.prompt], row[fields.completion]
    if isinstance(prompt, str) and isinstance(completion, str):
        return Example(_row_name([prompt, completion]), kind, prompt=prompt, completion=completion)
    if isinstance(prompt, str) or isinstance(completion, str):
        raise DataError(f"{where}: prompt and completion must both be strings or both message lists")
    prompt, completion = _messages(prompt, where, fields.prompt), _messages(completion, where, fields.completion)
    if not completion or any(m["role"] != "assistant" for m in completion):
        raise DataError(f"{where}: a conversational completion is the assistant's message(s)")
    return Example(_row_name([prompt, completion]), kind, prompt=prompt, completion=completion)


def _messages(value: Any, where: str, column: str) -> tuple:
    if not isinstance(value, (list, tuple)) or not all(isinstance(m, Mapping) and isinstance(m.get("role"), str)
                                                       and isinstance(m.get("content"), str) for m in value):
        raise DataError(f"{where}: {column!r} must be a list of {{'role': str, 'content': str}} messages")
    return tuple({"role": m["role"], "content": m["content"]} for m in value)


def _row_name(parts: list) -> str:
    return "sha256:" + hashlib.sha256(json.dumps(parts, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


def render_chat(tokenizer: Any, messages: Sequence[Mapping[str, str]]) -> tuple[str, list[tuple[int, int]]]:
    """The conversation rendered with the tokenizer's chat template, and the character spans of the assistant's
    turns (the rule in the module doc)."""
    if not getattr(tokenizer, "chat_template", None):
        raise KdcollapseError("this tokenizer has no chat template: chat examples need one (set "
                              "tokenizer.chat_template, or give text or string prompt/completion data)")
    messages = list(messages)

    def render(upto: int, prompt: bool) -> str:
        return tokenizer.apply_chat_template(messages[:upto], tokenize=False, add_generation_prompt=prompt)

    text = render(len(messages), False)
    spans = []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        before, through = render(i, True), render(i + 1, False)
        if not (through.startswith(before) and text.startswith(through)):
            raise KdcollapseError("the chat template does not render a conversation as a prefix of its "
                                  "continuation, so the assistant's tokens cannot be located")
        if len(through) > len(before):
            spans.append((len(before), len(through)))
    return text, spans


def leading_specials(tokenizer: Any) -> list[int]:
    """The special tokens the tokenizer puts before a text (a beginning-of-text token: Gemma's, Llama's; none for
    SmolLM's or GPT-2's), as ``tokenize_completion`` gives the prompt; a trailing end-of-text token left out."""
    ids = list(tokenizer("", add_special_tokens=True)["input_ids"])
    return ids[:-1] if ids and ids[-1] == tokenizer.eos_token_id else ids


def tokenize_example(tokenizer: Any, example: Example, *, loss_on: str = "completion") -> tuple[list[int], list[bool]]:
    """The token ids of ``example`` and, per token, whether the loss counts it (module doc). Text documents and
    string prompt/completion pairs end with the end-of-text token; a rendered conversation ends as its template
    writes it."""
    if loss_on not in LOSS_ON:
        raise KdcollapseError(unknown_choice("loss_on", loss_on, LOSS_ON))
    eos = tokenizer.eos_token_id
    if example.kind == "text":
        ids = tokenizer(example.text, add_special_tokens=False)["input_ids"] + [eos]
        return ids, [True] * len(ids)
    if example.kind == "prompt_completion" and isinstance(example.prompt, str):
        prompt = tokenizer(example.prompt, add_special_tokens=False)["input_ids"]
        completion = tokenizer(example.completion, add_special_tokens=False)["input_ids"] + [eos]
        return prompt + completion, [loss_on == "all"] * len(prompt) + [True] * len(completion)
    messages = example.messages if example.kind == "chat" else (*example.prompt, *example.completion)
    text, spans = render_chat(tokenizer, messages)
    if example.kind == "prompt_completion":  # only the completion's messages, not earlier assistant turns
        spans = spans[len(spans) - len(example.completion):]
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    ids = encoded["input_ids"]
    if loss_on == "all":
        return ids, [True] * len(ids)
    mask = [any(start < end_span and end > start_span for start_span, end_span in spans)
            for start, end in encoded["offset_mapping"]]
    return ids, mask
