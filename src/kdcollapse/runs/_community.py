"""``convert_weights``: a community checkpoint (mdistiller/CRD CIFAR teachers, timm-style ImageNet ResNets)
as a zoo model file that ``teacher.checkpoint=`` / ``load_model`` read."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import torch

from kdcollapse.errors import CheckpointError
from kdcollapse.models import (MDISTILLER_TEACHERS, classifier_shape, convert_state_dict, create_model, input_channels,
                               unwrap_state_dict)
from kdcollapse.runs._checkpoint import load_state, read_weights, save_model

CHECKPOINT_NAME = "ckpt_epoch_240.pth"  # the one file of each teacher's folder in cifar_teachers.tar


def convert_weights(src: str | Path, dst: str | Path, *, source: str, model_name: str) -> dict:
    """Read ``src`` (``.pth``/``.pt`` with ``weights_only=True``, or safetensors) in layout ``source``
    (``"mdistiller"`` or ``"timm"``), load it into the zoo's ``model_name`` and write ``dst`` (safetensors,
    with the metadata ``load_model`` needs). The class count and input channels come from the weights.
    Returns the metadata written."""
    state, _ = read_weights(Path(src))
    return _save(dst, *_converted(state, source, model_name, Path(src).name))


def _converted(state: dict, source: str, model_name: str, source_file: str) -> tuple:
    """The zoo's ``model_name`` holding ``state`` (layout ``source``), and the metadata of its model file."""
    num_classes, _ = classifier_shape(state, source)
    channels = input_channels(state)
    model = create_model(model_name, num_classes, in_channels=channels)
    load_state(model, convert_state_dict(state, model, source), source_file)
    meta = {"format": "kdcollapse.model", "version": 1, "model": model_name, "model_kwargs": {},
            "num_classes": num_classes, "in_channels": channels, "converted_from": source,
            "source_file": source_file}
    return model, meta


def _save(dst: str | Path, model, meta: dict) -> dict:
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    save_model(dst, model, meta)
    return meta


def archive_teachers(src: str | Path) -> dict[str, str]:
    """The teachers of mdistiller's ``cifar_teachers.tar`` at ``src``: member path -> the zoo's model name, for
    every ``<folder>/ckpt_epoch_240.pth`` whose folder is one of ``MDISTILLER_TEACHERS`` (at any depth: the release
    nests them under ``cifar_teachers/``). Only the member names are read."""
    try:
        with tarfile.open(src) as tar:
            names = [m.name for m in tar.getmembers() if m.isfile()]
    except (OSError, tarfile.TarError) as err:
        raise CheckpointError(f"{src} is not a readable tar archive ({type(err).__name__}: {err})") from None
    found = {}
    for name in names:
        parts = name.split("/")
        if len(parts) >= 2 and parts[-1] == CHECKPOINT_NAME and parts[-2] in MDISTILLER_TEACHERS:
            found[name] = MDISTILLER_TEACHERS[parts[-2]]
    if not found:
        raise CheckpointError(f"{src} holds no teacher of mdistiller's cifar_teachers.tar: expected "
                              f"<folder>/{CHECKPOINT_NAME} with a folder among {', '.join(MDISTILLER_TEACHERS)}")
    return found


def convert_archive(src: str | Path, out: str | Path, *, models: list[str] | None = None) -> dict[str, dict]:
    """Convert the teachers of mdistiller's ``cifar_teachers.tar`` (``src``; of those, the zoo names ``models``,
    else all) into ``out/teacher_<model>/model.safetensors``: the directories the CIFAR-100 recipes' and studies'
    ``teacher.checkpoint: runs/cifar100/teacher_<model>`` read when ``out`` is ``runs/cifar100``. Each member is
    read into memory and loaded with ``torch.load(weights_only=True)`` (tensors and plain containers only); nothing
    of the archive is extracted to disk. Returns zoo name -> the metadata written."""
    found = archive_teachers(src)
    if models is not None:
        missing = sorted(set(models) - set(found.values()))
        if missing:
            raise CheckpointError(f"{src} holds no teacher {', '.join(missing)}; it holds "
                                  f"{', '.join(sorted(found.values()))}")
        found = {k: v for k, v in found.items() if v in models}
    converted = {}
    with tarfile.open(src) as tar:  # every member read and converted (so checked) before anything is written
        for member, model_name in found.items():
            data = tar.extractfile(member).read()
            try:
                obj = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
            except Exception as err:  # pickle refuses other objects with UnpicklingError, or a corrupt file
                raise CheckpointError(f"{src}:{member} is not a plain torch checkpoint that loads with "
                                      f"weights_only=True ({type(err).__name__})") from None
            try:
                converted[model_name] = _converted(unwrap_state_dict(obj), "mdistiller", model_name,
                                                   f"{Path(src).name}:{member}")
            except CheckpointError as err:
                raise CheckpointError(f"{src}:{member}: {err}") from None
    return {name: _save(Path(out) / f"teacher_{name}" / "model.safetensors", *pair)
            for name, pair in converted.items()}
