"""Community weights into the zoo: the mdistiller/CRD CIFAR teachers and timm-style ImageNet ResNets.

The zoo's models are the same networks as mdistiller's ``mdistiller/models/cifar`` (CRD's
``cifar_teachers``: ``resnet8..110``, ``resnet8x4/32x4``, ``ResNet50`` = ``resnet50_cifar``,
``wrn_16_1..40_2``, ``vgg8..19``; the students ``MobileNetV2`` = ``mobilenetv2`` (their ``mobile_half``),
``ShuffleV1`` = ``shufflev1``, ``ShuffleV2`` = ``shufflev2``) and timm's ``resnet18/34/50``, with other key names
(``conv1``, ``bn1``, ``layer1.0.conv1``, ``downsample``, ``fc`` there; ``body.N…`` and ``head`` here).
Both define every layer in the order of its forward pass, so the conversion pairs the tensors in order: the
classifier (``fc``, ``linear``, ``classifier``, ``classifier.0`` or ``head``) with ``head``, every other tensor with
the zoo's next one, and checks each pair's kind (``weight``, ``bias``, ``running_mean``...) and shape, so a
state dict of another architecture is refused rather than loaded wrongly.
"""

from __future__ import annotations

from torch import Tensor, nn

from kdcollapse.errors import CheckpointError, unknown_choice

# The classifier's name in each layout (mdistiller: resnet.py/wrn.py `fc`, resnetv2.py and the ShuffleNets
# `linear`, vgg.py `classifier`, mobilenetv2.py `classifier.0` (a Linear in a Sequential); timm: `fc`, `head`,
# `head.fc`, `classifier`).
CLASSIFIERS = {
    "mdistiller": ("fc", "linear", "classifier", "classifier.0"),
    "timm": ("fc", "head.fc", "head", "classifier"),
}
# mdistiller's released ``cifar_teachers.tar`` (megvii-research/mdistiller, release "checkpoints"; CRD's teachers):
# ``cifar_teachers/<folder>/ckpt_epoch_240.pth`` per teacher, the folders of ``mdistiller/models/cifar/__init__.py``'s
# ``cifar_model_dict`` -> the zoo's name of that architecture.
MDISTILLER_TEACHERS = {"resnet56_vanilla": "resnet56", "resnet110_vanilla": "resnet110",
                       "resnet32x4_vanilla": "resnet32x4", "ResNet50_vanilla": "resnet50_cifar",
                       "wrn_40_2_vanilla": "wrn_40_2", "vgg13_vanilla": "vgg13"}
_COUNTER = "num_batches_tracked"  # BN's step counter: absent from old checkpoints, unused in eval


def unwrap_state_dict(obj: object) -> dict[str, Tensor]:
    """The tensors of a saved object: a state dict, or a training checkpoint holding one under ``model``
    or ``state_dict`` (mdistiller/CRD save ``{"model": ..., "epoch": ...}``); DataParallel's ``module.``
    prefix removed."""
    for key in ("model", "state_dict"):
        if isinstance(obj, dict) and isinstance(obj.get(key), dict):
            obj = obj[key]
    if not isinstance(obj, dict) or not obj or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError("expected a state dict (names -> tensors), or a checkpoint holding one under "
                              "'model' or 'state_dict'")
    if all(k.startswith("module.") for k in obj):
        obj = {k[len("module."):]: v for k, v in obj.items()}
    return dict(obj)


def convert_state_dict(state: dict[str, Tensor], model: nn.Module, source: str) -> dict[str, Tensor]:
    """``state`` in layout ``source`` (``"mdistiller"`` or ``"timm"``) re-keyed for the zoo ``model``
    (built with the same architecture and class count); ``CheckpointError`` at the first tensor that does
    not fit."""
    if source not in CLASSIFIERS:
        raise CheckpointError(unknown_choice("weights layout", source, CLASSIFIERS))
    state = unwrap_state_dict(state)
    head = _classifier_prefix(state, source)
    theirs = [(k, v) for k, v in state.items() if not k.startswith(head) and not k.endswith(_COUNTER)]
    theirs += [(k, v) for k, v in state.items() if k.startswith(head)]
    own = model.state_dict()
    ours = [k for k in own if not k.endswith(_COUNTER)]
    if len(theirs) != len(ours):
        raise CheckpointError(f"the {source} weights hold {len(theirs)} tensors, a {type(model).__name__} "
                              f"has {len(ours)}: another architecture?")
    out = _counters(state, own)
    for (their_key, value), our_key in zip(theirs, ours):
        if their_key.rpartition(".")[2] != our_key.rpartition(".")[2] or value.shape != own[our_key].shape:
            raise CheckpointError(
                f"{source} tensor {their_key} {tuple(value.shape)} does not fit {our_key} "
                f"{tuple(own[our_key].shape)}: the weights belong to another architecture or class count"
            )
        out[our_key] = value
    return {k: out[k] for k in own}


def _counters(state: dict[str, Tensor], own: dict[str, Tensor]) -> dict[str, Tensor]:
    """BN step counters, paired in order when both sides have them all, else the model's own."""
    ours = [k for k in own if k.endswith(_COUNTER)]
    theirs = [v for k, v in state.items() if k.endswith(_COUNTER)]
    return dict(zip(ours, theirs)) if len(theirs) == len(ours) else {k: own[k] for k in ours}


def _classifier_prefix(state: dict[str, Tensor], source: str) -> str:
    for name in CLASSIFIERS[source]:
        weight = state.get(f"{name}.weight")
        if weight is not None and weight.ndim == 2:
            return f"{name}."
    raise CheckpointError(f"no classifier in the {source} weights: expected one of "
                          f"{', '.join(n + '.weight' for n in CLASSIFIERS[source])}")


def classifier_shape(state: dict[str, Tensor], source: str) -> tuple[int, int]:
    """``(num_classes, feature_dim)`` of the classifier in ``state`` (layout ``source``)."""
    state = unwrap_state_dict(state)
    return tuple(state[_classifier_prefix(state, source) + "weight"].shape)  # type: ignore[return-value]


def input_channels(state: dict[str, Tensor]) -> int:
    """Input channels: the second dimension of the first 4-d (convolution) weight."""
    state = unwrap_state_dict(state)
    for value in state.values():
        if value.ndim == 4:
            return int(value.shape[1])
    raise CheckpointError("no convolution weight in the state dict to read the input channels from")


