"""The teacher's whole next-token distribution on held-out blocks, stored once: its last hidden states and its
output head, from which every logit is one product (``TeacherHead``). The evaluation of a run compares the student
with this, the full teacher, never with a top-k store (whose tail is a rule, not the teacher).

A reference is a directory: ``manifest.json`` (format, the blocks' shape and SHA-256, the hidden size and the SHA-256
of the tensors file), written last, and ``reference.safetensors`` holding ``hidden`` (n, T, H) and ``weight``
(V, H), both float32. Reading checks the checksum; nothing is pickled. One process builds a reference at a time
(a lock beside its directory), so that runs sharing it compute it once.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file

from kdcollapse.errors import DataError
from kdcollapse.lm._tokens import MANIFEST, blocks_digest, read_manifest, write_json, write_tensors
from kdcollapse.losses import TeacherHead

_FORMAT = "kdcollapse.teacher_reference"
TENSORS = "reference.safetensors"


@torch.no_grad()
def store_teacher_reference(model: Any, blocks: torch.Tensor, directory: str | Path, *, batch_size: int = 8) -> Path:
    """Run ``model`` (a ``transformers`` causal LM whose logits are its last hidden state times its output
    embeddings) on ``blocks`` (n, T) and store its last hidden states and head (module doc); an existing
    reference of the same blocks is kept as it is."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    with open(directory.parent / f".{directory.name}.lock", "a") as lock:  # released when the process ends
        fcntl.flock(lock, fcntl.LOCK_EX)
        digest = blocks_digest(blocks)
        if (directory / MANIFEST).is_file():
            if json.loads((directory / MANIFEST).read_text()).get("blocks_sha256") == digest:
                return directory
            raise DataError(f"{directory} holds the teacher reference of other blocks; choose another directory")
        directory.mkdir(parents=True, exist_ok=True)
        hidden = torch.cat([model.base_model(batch).last_hidden_state.float() for batch in blocks.split(batch_size)])
        weight = model.get_output_embeddings().weight.detach().float()
        sha = write_tensors(directory / TENSORS, {"hidden": hidden, "weight": weight})
        write_json(directory / MANIFEST, {"format": _FORMAT, "version": 1, "blocks": list(blocks.shape),
                                           "blocks_sha256": digest, "hidden_size": int(hidden.shape[-1]),
                                           "vocab": int(weight.shape[0]), "sha256": sha})
    return directory


@dataclass(frozen=True)
class TeacherReference:
    """A stored reference read back: the teacher's ``hidden`` (n, T, H) and head ``weight`` (V, H)."""

    hidden: torch.Tensor
    weight: torch.Tensor
    blocks_sha256: str

    @classmethod
    def load(cls, directory: str | Path) -> TeacherReference:
        directory = Path(directory)
        manifest = read_manifest(directory, _FORMAT, "teacher reference")
        path = directory / TENSORS
        if not path.is_file() or hashlib.sha256(path.read_bytes()).hexdigest() != manifest["sha256"]:
            raise DataError(f"{path} is missing or damaged (its SHA-256 differs from {MANIFEST}'s); delete "
                            f"{directory} to compute it again")
        tensors = load_file(str(path))
        return cls(tensors["hidden"], tensors["weight"], manifest["blocks_sha256"])

    def rows(self, block_index: torch.Tensor, positions: slice = slice(None)) -> TeacherHead:
        """The teacher of blocks ``block_index`` at ``positions``, flattened to rows (B·T', V)."""
        hidden = self.hidden[block_index, positions]
        return TeacherHead(hidden.reshape(-1, hidden.shape[-1]), self.weight)
