"""Reading classifier matrices and writing codes: .npy, .safetensors and weights-only .pt files."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import Tensor

from kdcollapse.errors import KdcollapseError, unknown_choice
from kdcollapse.geometry._codes import SphericalCode

SUFFIXES = (".npy", ".safetensors", ".pt", ".pth")


def load_matrix(path: str | Path, key: str | None = None) -> Tensor:
    """Load a 2-D matrix (e.g. a classifier's weight) from .npy, .safetensors or .pt/.pth.

    .pt files are read with ``torch.load(weights_only=True)`` (never unrestricted pickle). A file holding
    several tensors (a state dict, a safetensors file) needs ``key`` unless exactly one of them is 2-D.
    """
    path = Path(path)
    if path.suffix not in SUFFIXES:
        raise KdcollapseError(unknown_choice("matrix file type", path.suffix or path.name, SUFFIXES))
    if not path.is_file():
        raise KdcollapseError(f"no such file: {path}")
    try:
        if path.suffix == ".npy":
            tensors = {"": torch.from_numpy(np.load(path, allow_pickle=False))}
        elif path.suffix == ".safetensors":
            tensors = load_file(path)
        else:
            obj = torch.load(path, map_location="cpu", weights_only=True)
            tensors = {"": obj} if isinstance(obj, Tensor) else _flatten(obj)
    except KdcollapseError:
        raise
    except Exception as err:  # numpy, safetensors and torch each raise their own types for bad files
        raise KdcollapseError(f"cannot read {path}: {err}") from None
    return _pick(tensors, key, path)


def save_code(code: SphericalCode | Tensor, path: str | Path) -> Path:
    """Write a code's W (K, d) to .safetensors (with its values as metadata; softmax features as "H") or .npy."""
    path = Path(path)
    W = code.W if isinstance(code, SphericalCode) else code
    if path.suffix == ".npy":
        np.save(path, W.detach().cpu().numpy())
        return path
    if path.suffix != ".safetensors":
        raise KdcollapseError(unknown_choice("code file type", path.suffix or path.name, (".npy", ".safetensors")))
    tensors = {"W": W.detach().cpu().contiguous()}
    metadata = {}
    if isinstance(code, SphericalCode):
        if code.features is not None:
            tensors["H"] = code.features.contiguous()
        metadata = {
            "kind": code.kind,
            "one_vs_rest": repr(code.one_vs_rest),
            "one_vs_one": repr(code.one_vs_one),
            "min_angle_degrees": repr(code.min_angle),
            "restart_values": json.dumps(code.restart_values),
        }
    save_file(tensors, path, metadata=metadata)
    return path


def _flatten(obj: object, prefix: str = "") -> dict[str, Tensor]:
    """Tensors of a (possibly nested) dict, keyed by dotted path."""
    if isinstance(obj, Tensor):
        return {prefix: obj}
    if isinstance(obj, dict):
        out = {}
        for name, value in obj.items():
            out.update(_flatten(value, f"{prefix}.{name}" if prefix else str(name)))
        return out
    return {}


def _pick(tensors: dict[str, Tensor], key: str | None, path: Path) -> Tensor:
    if key is not None:
        if key not in tensors:
            raise KdcollapseError(unknown_choice(f"tensor in {path.name}", key, tensors))
        matrix = tensors[key]
    else:
        matrices = {name: t for name, t in tensors.items() if t.ndim == 2}
        if len(matrices) != 1:
            raise KdcollapseError(
                f"{path} holds {len(matrices)} 2-D tensors; choose one with --key: {', '.join(sorted(matrices))}"
            )
        matrix = next(iter(matrices.values()))
    if matrix.ndim != 2:
        raise KdcollapseError(f"{path}: {key!r} has shape {tuple(matrix.shape)}, expected a (K, d) matrix")
    return matrix
