"""Stored teacher tokens: a teacher's top-k log-probabilities and the log of the rest's mass at every
position of a set of token blocks, computed once and written in safetensors shards with a SHA-256 per
shard, so training needs no teacher in memory. Nothing is pickled.

A store is a directory: ``manifest.json`` (format, k, vocabulary, temperature, the blocks' shape, the
SHA-256 of the blocks and each shard's file name, rows and SHA-256 of its bytes) and
``shard-NNNNN.safetensors`` files holding ``log_probs`` (n, T, k) float32, ``indices`` (n, T, k) int32 and
``log_rest`` (n, T) float32 for blocks ``[start, stop)``. The manifest is written last, so a directory
without one is an unfinished store. Reading checks every shard's checksum.

An unfinished store resumes: after each shard, ``progress.json`` (the manifest's fields so far) is rewritten,
so a store interrupted after shard j keeps shards 0 … j and a later call with the same blocks, k, τ and shard
size computes only the rest (each kept shard's bytes checked against its SHA-256 first; one that differs is
computed again).

``precision="bf16"`` runs the teacher's decoder body under bf16 autocast and its head in float32 on the body's
last hidden states cast back (:func:`teacher_logits`): half the CPU time of a float32 teacher on a CPU with
native bf16, targets within bf16 rounding of the float32 teacher's (benchmarks/bench_teacher_precision.py).
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from kdcollapse.errors import DataError, KdcollapseError
from kdcollapse.losses import TopKTeacher

_FORMAT = "kdcollapse.teacher_tokens"
TEACHER_PRECISIONS = ("float32", "bf16")
MANIFEST = "manifest.json"
PROGRESS = "progress.json"  # an unfinished store's shards so far


def blocks_digest(blocks: torch.Tensor) -> str:
    return hashlib.sha256(blocks.to(torch.int64).contiguous().numpy().tobytes()).hexdigest()


def check_teacher_precision(precision: str) -> None:
    if precision not in TEACHER_PRECISIONS:
        raise KdcollapseError(f"the teacher's precision must be one of {', '.join(TEACHER_PRECISIONS)}, "
                              f"got {precision!r}")


def teacher_hidden(model: Any, ids: torch.Tensor, precision: str = "float32") -> torch.Tensor:
    """The last hidden states (after the final norm) of ``model``'s decoder body on ``ids``, in float32; ``bf16``:
    the body under bf16 autocast (module doc)."""
    check_teacher_precision(precision)
    with torch.autocast(ids.device.type, dtype=torch.bfloat16, enabled=precision == "bf16"):
        hidden = model.base_model(ids).last_hidden_state
    return hidden.float()


def teacher_logits(model: Any, ids: torch.Tensor, precision: str = "float32") -> torch.Tensor:
    """``model``'s logits on ``ids``: its whole forward (``float32``), or its body under bf16 autocast and its
    output head in float32 (``bf16``: a bf16 head would round a logit of 20 by up to 0.06)."""
    if precision == "float32":
        return model(ids).logits
    return model.get_output_embeddings()(teacher_hidden(model, ids, precision))


@torch.no_grad()
def store_teacher_tokens(model: Any, blocks: torch.Tensor, directory: str | Path, *, k: int,
                         temperature: float = 1.0, batch_size: int = 8, shard_blocks: int = 256,
                         dtype: torch.dtype = torch.float32, precision: str = "float32") -> Path:
    """Run ``model`` (a ``transformers`` causal LM) on ``blocks`` (n, T) ``batch_size`` blocks at a time
    and store the top ``k`` log-probabilities of softmax(logits / τ) at every position (module doc), its body
    in ``precision`` (:func:`teacher_logits`). An existing complete store of the same blocks, k, τ and
    precision is kept as it is. One process builds a store at a time: another that asks for it meanwhile (two
    runs of a study sharing it) waits, then finds it complete."""
    directory = Path(directory)
    vocab = int(model.get_output_embeddings().weight.shape[0])
    if not (isinstance(k, int) and 1 <= k <= vocab):
        raise KdcollapseError(f"k must be an int in [1, {vocab}], got {k!r}")
    check_teacher_precision(precision)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "a") as lock:  # released when the process ends
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _store(model, blocks, directory, k, temperature, batch_size, shard_blocks, dtype, vocab, precision)


def _store(model, blocks, directory: Path, k: int, temperature: float, batch_size: int, shard_blocks: int,
           dtype: torch.dtype, vocab: int, precision: str) -> Path:
    digest = blocks_digest(blocks)
    if (directory / MANIFEST).is_file():
        manifest = json.loads((directory / MANIFEST).read_text())
        if (manifest.get("blocks_sha256"), manifest.get("k"), manifest.get("temperature"),
                manifest.get("teacher_precision", "float32")) == (digest, k, temperature, precision):
            return directory
        raise KdcollapseError(f"{directory} holds teacher tokens of other blocks, k, temperature or precision; "
                              f"choose another directory")
    directory.mkdir(parents=True, exist_ok=True)
    manifest = {"format": _FORMAT, "version": 1, "k": k, "vocab": vocab, "temperature": temperature,
                "blocks": list(blocks.shape), "blocks_sha256": digest, "shard_blocks": shard_blocks}
    if precision != "float32":  # a float32 store's manifest is as it was before the option
        manifest["teacher_precision"] = precision
    done = _finished_shards(directory, manifest)
    shards = []
    for start in range(0, len(blocks), shard_blocks):
        part = blocks[start:start + shard_blocks]
        name = f"shard-{len(shards):05d}.safetensors"
        kept = done.get(name)
        if kept is not None and (kept["start"], kept["stop"]) == (start, start + len(part)) \
                and _sha256(directory / name) == kept["sha256"]:
            shards.append(kept)
            continue
        rows = [TopKTeacher.from_logits(teacher_logits(model, batch, precision).to(dtype), k, temperature)
                for batch in part.split(batch_size)]
        tensors = {"log_probs": torch.cat([r.log_probs_topk for r in rows]),
                   "indices": torch.cat([r.indices for r in rows]),
                   "log_rest": torch.cat([r.log_rest for r in rows])}
        shards.append({"file": name, "start": start, "stop": start + len(part),
                       "sha256": write_tensors(directory / name, tensors)})
        write_json(directory / PROGRESS, {**manifest, "shards": shards})
    write_json(directory / MANIFEST, {**manifest, "shards": shards})
    (directory / PROGRESS).unlink(missing_ok=True)
    return directory


def _finished_shards(directory: Path, manifest: dict) -> dict[str, dict]:
    """The shards an interrupted store of the same blocks, k, τ and shard size recorded (file name -> entry)."""
    try:
        progress = json.loads((directory / PROGRESS).read_text())
    except (OSError, ValueError):
        return {}
    if not isinstance(progress, dict) or any(progress.get(key) != value for key, value in manifest.items()):
        return {}
    return {shard["file"]: shard for shard in progress.get("shards", [])}


def _sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def read_manifest(directory: Path, form: str, what: str) -> dict:
    """``directory``'s ``manifest.json`` of the format ``form``, else one error saying the folder holds no ``what``."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
    except (OSError, ValueError):
        raise DataError(f"{directory} holds no {what} (no readable {MANIFEST})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != form:
        raise DataError(f"{directory / MANIFEST} is not the manifest of a {what}")
    return manifest


def write_json(path: Path, value: dict) -> None:
    """``value`` as JSON in ``path``, whole or not at all (written beside it, then renamed)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(value, indent=1) + "\n")
    os.replace(tmp, path)


def write_tensors(path: Path, tensors: dict[str, torch.Tensor]) -> str:
    """``tensors`` as safetensors in ``path``, whole or not at all; returns the file's SHA-256."""
    tmp = path.with_name(f".{path.name}.tmp")
    save_file({name: t.contiguous() for name, t in tensors.items()}, str(tmp))
    digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
    os.replace(tmp, path)
    return digest


@dataclass(frozen=True)
class TeacherTokens:
    """A store read back: (n, T, k) ``log_probs`` and ``indices``, (n, T) ``log_rest``, at ``temperature``."""

    log_probs: torch.Tensor
    indices: torch.Tensor
    log_rest: torch.Tensor
    temperature: float
    vocab: int
    blocks_sha256: str

    @classmethod
    def load(cls, directory: str | Path) -> TeacherTokens:
        """Every shard of the store in ``directory``, each checked against its SHA-256."""
        directory = Path(directory)
        manifest = read_manifest(directory, _FORMAT, "complete store of teacher tokens")
        parts = []
        for shard in manifest["shards"]:
            path = directory / shard["file"]
            data = path.read_bytes() if path.is_file() else b""
            if hashlib.sha256(data).hexdigest() != shard["sha256"]:
                raise DataError(f"{path} is missing or damaged (its SHA-256 differs from {MANIFEST}'s); store the "
                                f"teacher tokens again")
            parts.append(load_file(str(path)))
        return cls(*(torch.cat([p[name] for p in parts]) for name in ("log_probs", "indices", "log_rest")),
                   manifest["temperature"], manifest["vocab"], manifest["blocks_sha256"])

    def top(self, k: int) -> TeacherTokens:
        """The store cut to its top ``k`` (≤ its own k): the first k of the sorted top-k log-probabilities and
        their ids, and the rest's mass grown by the entries cut, log_rest' = log(exp(log_rest) + Σ_cut p).
        Equal, to float32 rounding of that sum, to a store written at ``k`` (the top k of the top k' > k are
        the top k); ``tests/test_lm.py``."""
        stored = self.log_probs.shape[-1]
        if not (isinstance(k, int) and 1 <= k <= stored):
            raise KdcollapseError(f"k must be an int in [1, {stored}] to cut a store of k = {stored}, got {k!r}")
        if k == stored:
            return self
        cut = self.log_probs[..., k:].float().logsumexp(-1)
        return TeacherTokens(self.log_probs[..., :k].contiguous(), self.indices[..., :k].contiguous(),
                             torch.logaddexp(self.log_rest.float(), cut), self.temperature, self.vocab,
                             self.blocks_sha256)

    def rows(self, block_index: torch.Tensor, positions: slice = slice(None), tail: str = "uniform") -> TopKTeacher:
        """The stored tokens of blocks ``block_index`` at ``positions``, flattened to rows (B·T', ...), read by the
        rule ``tail`` (:class:`kdcollapse.losses.TopKTeacher`)."""
        k = self.log_probs.shape[-1]
        return TopKTeacher(self.log_probs[block_index, positions].reshape(-1, k),
                           self.indices[block_index, positions].reshape(-1, k),
                           self.log_rest[block_index, positions].reshape(-1), self.temperature, tail)
