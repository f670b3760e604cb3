"""``convert_weights``: a community checkpoint (mdistiller/CRD CIFAR teachers, timm-style ImageNet ResNets)
as a zoo model file that ``teacher.checkpoint=`` / ``load_model`` read."""

from __future__ import annotations

from pathlib import Path

from kdcollapse.models import classifier_shape, convert_state_dict, create_model, input_channels
from kdcollapse.runs._checkpoint import load_state, read_weights, save_model


def convert_weights(src: str | Path, dst: str | Path, *, source: str, model_name: str) -> dict:
    """Read ``src`` (``.pth``/``.pt`` with ``weights_only=True``, or safetensors) in layout ``source``
    (``"mdistiller"`` or ``"timm"``), load it into the zoo's ``model_name`` and write ``dst`` (safetensors,
    with the metadata ``load_model`` needs). The class count and input channels come from the weights.
    Returns the metadata written."""
    state, _ = read_weights(Path(src))
    num_classes, _ = classifier_shape(state, source)
    channels = input_channels(state)
    model = create_model(model_name, num_classes, in_channels=channels)
    load_state(model, convert_state_dict(state, model, source), str(src))
    meta = {"format": "kdcollapse.model", "version": 1, "model": model_name, "model_kwargs": {},
            "num_classes": num_classes, "in_channels": channels, "converted_from": source,
            "source_file": Path(src).name}
    Path(dst).parent.mkdir(parents=True, exist_ok=True)
    save_model(dst, model, meta)
    return meta
