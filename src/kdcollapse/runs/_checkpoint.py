"""Checkpoints as safetensors files with JSON metadata, written atomically, read without pickle.

A file holds named tensors plus one JSON document (stored in the safetensors header's string
metadata) and the SHA-256 of its tensors (names, dtypes, shapes and bytes), checked on every load, so a
flipped bit is an error rather than a silently different model. Writing goes through
:mod:`kdcollapse.runs._atomic`: a crash leaves either the old file or the new one, never a torn one.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import load_file, save_file

from kdcollapse.errors import CheckpointError
from kdcollapse.models import adapt_state_dict, create_model, unwrap_state_dict
from kdcollapse.models.heads import head_from_spec, layers_from_spec, layers_spec
from kdcollapse.runs._atomic import replacing

_META_KEY = "kdcollapse"
_DIGEST_KEY = "kdcollapse.sha256"
_ALIASES_KEY = "kdcollapse.aliases"  # {name: name it is tied to}, see split_aliases


def tensors_digest(tensors: dict[str, torch.Tensor]) -> str:
    """SHA-256 over every tensor's name, dtype, shape and bytes, in name order."""
    h = hashlib.sha256()
    for name in sorted(tensors):
        t = tensors[name]
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_tensors(path: str | Path, tensors: dict[str, torch.Tensor], meta: dict) -> str:
    """Atomically write ``tensors`` and the JSON-serialisable ``meta`` to ``path`` (mode 0666 less the
    umask, like any file the user writes); returns the digest. Tied tensors (one tensor under two names)
    are stored once."""
    with replacing(path) as tmp:
        digest = write_tensors(tmp, tensors, meta)
    return digest


def write_tensors(path: Path, tensors: dict[str, torch.Tensor], meta: dict) -> str:
    """Write (not atomically: see :func:`save_tensors`) and return the tensors' digest."""
    tensors, aliases = split_aliases(tensors)
    tensors = {k: v.detach().to("cpu").contiguous() for k, v in tensors.items()}
    digest = tensors_digest(tensors)
    header = {_META_KEY: json.dumps(meta), _DIGEST_KEY: digest}
    save_file(tensors, path, metadata=header | ({_ALIASES_KEY: json.dumps(aliases)} if aliases else {}))
    return digest


def split_aliases(tensors: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """``(unique, aliases)``: safetensors refuses tensors that share memory, so a tensor that is the same
    view of the same memory as an earlier one (a tied weight, e.g. a language model's output layer and its
    embedding) is dropped and recorded as ``aliases[name] = earlier name``; a tensor that overlaps another
    one differently (a slice of it) is copied."""
    unique: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    views: dict[tuple, str] = {}
    storages: set[tuple] = set()
    for name, t in tensors.items():
        storage = (t.device, t.untyped_storage().data_ptr())
        view = (*storage, t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)
        if view in views:
            aliases[name] = views[view]
            continue
        if storage in storages and t.untyped_storage().nbytes():
            t = t.clone()
        views[view] = name
        storages.add(storage)
        unique[name] = t
    return unique, aliases


def join_aliases(tensors: dict[str, torch.Tensor], aliases: dict[str, str]) -> dict[str, torch.Tensor]:
    """``tensors`` with every alias of :func:`split_aliases` restored as the same tensor object."""
    return tensors | {name: tensors[target] for name, target in aliases.items()}


def read_header(path: str | Path) -> tuple[dict, str | None]:
    """``(meta, digest)`` from a safetensors header alone (no tensor data is read)."""
    try:
        with safe_open(path, framework="pt") as f:
            header = f.metadata() or {}
        return json.loads(header.get(_META_KEY, "{}")), header.get(_DIGEST_KEY)
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint ({err})") from None


def load_tensors(path: str | Path, device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict]:
    """Read a file written by :func:`save_tensors` (or any safetensors file: its meta is then ``{}``),
    checking its digest when it carries one; tied tensors come back as one tensor under each name."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint file not found: {path}")
    meta, digest = read_header(path)
    try:
        tensors = load_file(path, device="cpu")
        with safe_open(path, framework="pt") as f:
            aliases = json.loads((f.metadata() or {}).get(_ALIASES_KEY, "{}"))
    except (SafetensorError, OSError, ValueError) as err:
        raise CheckpointError(f"{path} is not a readable safetensors checkpoint ({err})") from None
    if digest is not None and tensors_digest(tensors) != digest:
        raise CheckpointError(f"{path} is corrupt: its tensor data does not match the checksum written with it")
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} has damaged metadata (not a JSON object)")
    try:
        return join_aliases({k: v.to(device) for k, v in tensors.items()}, aliases), meta
    except (KeyError, TypeError, AttributeError):
        raise CheckpointError(f"{path} has damaged metadata (its tied-tensor map names a missing tensor)") from None


TORCH_SUFFIXES = (".pth", ".pt")


def read_torch_weights(path: str | Path, device: str | torch.device = "cpu") -> dict[str, torch.Tensor]:
    """The state dict in a ``.pth``/``.pt`` file, read with ``torch.load(weights_only=True)``: tensors and
    plain containers only, never arbitrary pickled objects. A training checkpoint holding the state dict
    under ``model`` or ``state_dict`` (mdistiller/CRD) is unwrapped."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"weights file not found: {path}")
    try:
        obj = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # pickle refuses other objects with UnpicklingError, or a corrupt file
        raise CheckpointError(
            f"{path} is not a plain torch state dict that loads with weights_only=True ({type(err).__name__}: "
            f"{str(err).splitlines()[0] if str(err) else ''}); save model.state_dict(), not the model"
        ) from None
    try:
        return unwrap_state_dict(obj)
    except CheckpointError as err:
        raise CheckpointError(f"{path}: {err}") from None


def read_weights(path: Path, device: str | torch.device = "cpu") -> tuple[dict[str, torch.Tensor], dict]:
    """``(tensors, meta)`` of a safetensors file, or of a ``.pth``/``.pt`` state dict (meta ``{}``)."""
    if path.suffix in TORCH_SUFFIXES:
        return read_torch_weights(path, device), {}
    return load_tensors(path, device=device)


def flatten_optimizer(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """Split ``optimizer.state_dict()`` into tensors and a JSON-able remainder (no pickle needed)."""
    tensors, scalars = {}, {}
    for index, param_state in state["state"].items():
        for name, value in param_state.items():
            if torch.is_tensor(value):
                tensors[f"{index}.{name}"] = value
            else:
                scalars[f"{index}.{name}"] = value
    return tensors, {"param_groups": state["param_groups"], "scalars": scalars}


def unflatten_optimizer(tensors: dict[str, torch.Tensor], rest: dict, params: list[torch.Tensor],
                        source: str) -> dict:
    """Inverse of :func:`flatten_optimizer`, checked against the optimizer's ``params`` (in the order of its
    param groups): a state for a parameter that does not exist, or a buffer of another shape, is an error."""
    state: dict[int, dict] = {}
    for key, value in [*tensors.items(), *rest["scalars"].items()]:
        index, _, name = key.partition(".")
        if not (index.isdigit() and int(index) < len(params) and name):
            raise CheckpointError(f"{source}: the optimizer state names parameter {key!r}, which this model "
                                  f"does not have ({len(params)} parameters)")
        if torch.is_tensor(value) and value.dim() > 0 and value.shape != params[int(index)].shape:
            raise CheckpointError(f"{source}: the optimizer's {name} of parameter {index} has shape "
                                  f"{tuple(value.shape)}, the parameter {tuple(params[int(index)].shape)}")
        state.setdefault(int(index), {})[name] = value
    return {"state": state, "param_groups": rest["param_groups"]}


# Checkpoint metadata a resume reads, with the JSON types each must have.
_CHECKPOINT_FIELDS = {"epoch": int, "best_epoch": int, "best_acc": (int, float), "last_acc": (int, float),
                      "model": str, "method": str, "dataset": str, "optimizer": dict}


def check_checkpoint_meta(meta: dict, source: str) -> dict:
    """``meta`` if it has every field a resume needs with the right type, else a :class:`CheckpointError`."""
    for key, kind in _CHECKPOINT_FIELDS.items():
        value = meta.get(key)
        if not isinstance(value, kind) or isinstance(value, bool):
            got = "missing" if key not in meta else f"{type(value).__name__} {value!r}"[:80]
            raise CheckpointError(f"{source} has damaged metadata: '{key}' is {got}; it is not a checkpoint "
                                  "this version of kdcollapse wrote")
    if meta["epoch"] < 0 or not 0 <= meta["best_epoch"] <= meta["epoch"]:
        raise CheckpointError(f"{source} has damaged metadata: epoch {meta['epoch']}, best epoch "
                              f"{meta['best_epoch']}")
    optimizer = meta["optimizer"]
    if not (isinstance(optimizer.get("param_groups"), list) and isinstance(optimizer.get("scalars"), dict)
            and all(isinstance(g, dict) and isinstance(g.get("params"), list) for g in optimizer["param_groups"])):
        raise CheckpointError(f"{source} has damaged metadata: the optimizer state lacks its param groups")
    return meta


def split_prefix(tensors: dict[str, torch.Tensor], prefix: str) -> dict[str, torch.Tensor]:
    return {k[len(prefix):]: v for k, v in tensors.items() if k.startswith(prefix)}


def load_state(module: torch.nn.Module, state: dict[str, torch.Tensor], source: str) -> None:
    """``load_state_dict(strict=True)`` with a readable error when the weights belong to another model."""
    own = module.state_dict()
    missing = sorted(set(own) - set(state))
    unexpected = sorted(set(state) - set(own))
    wrong = sorted(k for k in set(own) & set(state) if own[k].shape != state[k].shape)
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing (e.g. {missing[0]})")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected (e.g. {unexpected[0]})")
        if wrong:
            k = wrong[0]
            parts.append(f"{len(wrong)} of another shape (e.g. {k}: {tuple(state[k].shape)} vs {tuple(own[k].shape)})")
        raise CheckpointError(
            f"the weights in {source} do not fit {type(module).__name__}: " + "; ".join(parts)
            + ". Were they saved from another model or class count?"
        )
    module.load_state_dict(state)


def model_meta(cfg, dataset, **extra) -> dict:
    """What is needed to rebuild and use a trained model without its run config."""
    return {
        "format": "kdcollapse.model", "version": 1, "model": cfg.model.name, "model_kwargs": cfg.model.kwargs,
        "num_classes": dataset.num_classes, "classes": list(dataset.classes), "in_channels": dataset.in_channels,
        "input_shape": list(dataset.input_shape), "dataset": cfg.data.name,
        "mean": list(dataset.mean), "std": list(dataset.std), "method": cfg.method.name, **extra,
    }


EXTRA_HEADS = "extra_heads."  # the prefix of the extra heads' tensors in a model file


def model_file(model: torch.nn.Module, meta: dict,
               heads: dict[str, torch.nn.Module] | None = None) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors and metadata of a model file; a special head (``kdcollapse.models.heads``) adds its
    ``spec()`` as ``meta["head"]``, so that :func:`load_model` can rebuild it. ``heads``: a method's extra
    classifier heads (``Method.extra_heads``), saved under ``extra_heads.<label>.`` with their layer
    description in ``meta["extra_heads"]`` (:func:`read_extra_heads` rebuilds them without the method)."""
    head = getattr(model, "head", None)
    if callable(getattr(head, "spec", None)):
        meta = meta | {"head": head.spec()}
    tensors = dict(model.state_dict())
    specs = {}
    for label, module in (heads or {}).items():
        spec = layers_spec(module)
        if spec is not None:
            specs[label] = spec
            tensors |= {f"{EXTRA_HEADS}{label}.{k}": v for k, v in module.state_dict().items()}
    return tensors, meta | ({"extra_heads": specs} if specs else {})


def read_extra_heads(tensors: dict[str, torch.Tensor], meta: dict) -> dict[str, torch.nn.Module]:
    """The extra heads a model file carries (see :func:`model_file`), in eval mode."""
    return {label: layers_from_spec(spec, split_prefix(tensors, f"{EXTRA_HEADS}{label}."))
            for label, spec in meta.get("extra_heads", {}).items()}


def save_model(path: str | Path, model: torch.nn.Module, meta: dict) -> None:
    """Write the weights and ``meta`` (see :func:`model_file`)."""
    save_tensors(path, *model_file(model, meta))


def read_model(path: str | Path, device: str | torch.device = "cpu", *, model_name: str | None = None,
               num_classes: int | None = None, in_channels: int | None = None, model_kwargs: dict | None = None):
    """Rebuild a model saved by ``kdcollapse train``: ``(model, meta)``; the one reader of model files.

    ``path`` is a ``model.safetensors`` file (a run directory is read at its commit by
    :func:`kdcollapse.runs.load_model`, which the library uses). A plain safetensors file
    without kdcollapse metadata, or a ``.pth``/``.pt`` state dict (read with ``weights_only=True``), needs
    ``model_name`` and ``num_classes`` (and ``in_channels``); its keys must be the model's (convert a
    community layout first: ``kdcollapse models convert``). ``model_kwargs`` override the file's model
    options. The extra heads a file carries are left out (:func:`read_extra_heads` reads them).
    """
    path = Path(path)
    state, meta = read_weights(path, device)
    state = {k: v for k, v in state.items() if not k.startswith(EXTRA_HEADS)}
    name = model_name or meta.get("model")
    classes = num_classes or meta.get("num_classes")
    if name is None or classes is None:
        raise CheckpointError(
            f"{path} carries no kdcollapse metadata; give the model name and class count "
            "(teacher.model=NAME, or --model NAME)"
        )
    channels = in_channels or meta.get("in_channels", 3)
    if meta.get("model") and model_name and model_name != meta["model"]:
        raise CheckpointError(f"{path} holds a '{meta['model']}', not a '{model_name}'")
    if meta.get("num_classes") and num_classes and num_classes != meta["num_classes"]:
        raise CheckpointError(f"{path} holds a {meta['num_classes']}-class model, expected {num_classes} classes")
    options = {**meta.get("model_kwargs", {}), **(model_kwargs or {})}
    model = create_model(name, classes, in_channels=channels, **options).to(device)
    if "head" in meta:  # a special head recorded by save_model
        model.head = head_from_spec(meta["head"], split_prefix(state, "head.")).to(device)
    load_state(model, adapt_state_dict(model, state), str(path))
    return model, meta
