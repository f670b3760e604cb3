"""Classifier heads with unit-norm class vectors (GNC paper Sections 4 and 5).

Each head maps (B, d) features to (B, K) logits ``<h/||h||, w_k/||w_k||> / temperature`` -- the
spherical constraint of eq. 1-2 -- and can replace ``model.head`` of a
:class:`kdcollapse.models.Classifier`:

* :class:`CosineHead`: trainable class vectors (normalised in the forward pass);
* :class:`ClassMeanFeatureHead`: the CMF classifier of Section 5 / App. B.1, W an exponential moving
  average of the batch class means of the normalised features, never trained by gradients;
* :class:`FixedHead`: a fixed code (e.g. a softmax code) with a chosen class assignment (Section 4).

:func:`make_head` builds one by name (the ``spherical`` training method uses it); every head describes
itself with ``spec()`` (JSON, stored in model files) and :func:`head_from_spec` rebuilds it from that
description and its tensors (``kdcollapse.train.load_model`` uses it).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor, nn

from kdcollapse.errors import KdcollapseError, unknown_choice
from kdcollapse.geometry import SUFFIXES, closed_form_code, load_matrix, simplex_etf, softmax_code, tammes_code, unit_rows

HEAD_KINDS = ("cosine", "cmf", "fixed")
CODE_NAMES = ("softmax", "tammes", "etf")


class _SphericalHead(nn.Module):
    """Shared forward: cosine logits over the normalised ``weight`` (K, d), divided by the temperature."""

    weight: Tensor
    kind: str

    def __init__(self, in_features: int, num_classes: int, temperature: float):
        super().__init__()
        if in_features < 1 or num_classes < 2:
            raise KdcollapseError(f"need in_features >= 1 and num_classes >= 2, got {in_features}, {num_classes}")
        if not temperature > 0:
            raise KdcollapseError(f"temperature must be positive, got {temperature}")
        self.in_features, self.num_classes, self.temperature = in_features, num_classes, float(temperature)

    def forward(self, features: Tensor) -> Tensor:
        if features.ndim != 2 or features.shape[1] != self.in_features:
            raise KdcollapseError(
                f"{type(self).__name__} expects (B, {self.in_features}) features, got {tuple(features.shape)}"
            )
        return F.normalize(features, dim=1) @ F.normalize(self.weight, dim=1).T / self.temperature

    def spec(self) -> dict:
        """What :func:`head_from_spec` needs besides the state dict (JSON-serialisable)."""
        return {"kind": self.kind, "temperature": self.temperature}

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, num_classes={self.num_classes}, temperature={self.temperature}"


class CosineHead(_SphericalHead):
    """logits = <h/||h||, w_k/||w_k||> / temperature with trainable w_k (GNC eq. 1 under the constraint of eq. 2)."""

    kind = "cosine"

    def __init__(self, in_features: int, num_classes: int, temperature: float = 0.1):
        super().__init__(in_features, num_classes, temperature)
        self.weight = nn.Parameter(F.normalize(torch.randn(num_classes, in_features), dim=1))


class ClassMeanFeatureHead(_SphericalHead):
    """Class-mean-feature (CMF) classifier (GNC Section 5, App. B.1): W <- beta W + (1 - beta) Hbar_batch.

    ``weight`` is a buffer (saved in the state dict, no gradient, invisible to optimisers). The
    training method calls :meth:`update` with the batch's features and labels after the forward pass
    of each training step: for every class present in the batch, the row becomes
    normalise(beta * w_k + (1 - beta) * mean of the normalised features of class k); absent classes keep
    their row. Under ``torch.distributed`` the per-class sums and counts are all-reduced first, so every
    process applies the same update, equal to the one on the global batch.
    """

    kind = "cmf"

    def __init__(self, in_features: int, num_classes: int, beta: float = 0.9, temperature: float = 0.1):
        super().__init__(in_features, num_classes, temperature)
        if not 0 <= beta < 1:
            raise KdcollapseError(f"beta must be in [0, 1), got {beta}")
        self.beta = float(beta)
        self.register_buffer("weight", F.normalize(torch.randn(num_classes, in_features), dim=1))

    @torch.no_grad()
    def update(self, features: Tensor, labels: Tensor) -> None:
        """EMA step of W towards the batch class means of the normalised ``features`` (B, d) of ``labels`` (B,)."""
        if features.ndim != 2 or features.shape[1] != self.in_features or labels.shape != features.shape[:1]:
            raise KdcollapseError(
                f"update expects (B, {self.in_features}) features and (B,) labels, "
                f"got {tuple(features.shape)} and {tuple(labels.shape)}"
            )
        if len(labels) and (labels.min() < 0 or labels.max() >= self.num_classes):
            raise KdcollapseError(f"labels must lie in [0, {self.num_classes}), got {labels.min()}..{labels.max()}")
        if not torch.isfinite(features).all():
            raise KdcollapseError("ClassMeanFeatureHead.update got NaN or infinite features")
        h = F.normalize(features.detach().to(self.weight.dtype), dim=1)
        sums = torch.zeros_like(self.weight).index_add_(0, labels, h)
        counts = torch.bincount(labels, minlength=self.num_classes).to(self.weight.dtype)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(sums)
            dist.all_reduce(counts)
        present = counts > 0
        means = sums[present] / counts[present, None]
        self.weight[present] = F.normalize(self.beta * self.weight[present] + (1 - self.beta) * means, dim=1)

    def spec(self) -> dict:
        return super().spec() | {"beta": self.beta}

    def extra_repr(self) -> str:
        return f"{super().extra_repr()}, beta={self.beta}"


class FixedHead(_SphericalHead):
    """A fixed classifier from a code W (K, d) and a class assignment (GNC Section 4).

    Class c uses code row ``assignment[c]`` (default: the identity), so ``weight = normalise(code)[assignment]``;
    logits are cosines divided by the temperature. ``weight`` and ``assignment`` are buffers, never trained.
    """

    kind = "fixed"

    def __init__(self, code: Tensor, assignment: Tensor | list[int] | None = None, temperature: float = 0.1):
        code = unit_rows(code, "code")
        K, d = code.shape
        super().__init__(d, K, temperature)
        assignment = _check_assignment(torch.arange(K) if assignment is None else assignment, K)
        self.register_buffer("assignment", assignment)
        self.register_buffer("weight", code[assignment].float())

    def spec(self) -> dict:
        return super().spec() | {"assignment": self.assignment.tolist()}


def _check_assignment(assignment: Tensor | list[int], num_classes: int) -> Tensor:
    """``assignment`` as an int64 tensor; ``KdcollapseError`` unless it is a permutation of 0..K-1."""
    assignment = torch.as_tensor(assignment)
    is_permutation = (
        assignment.shape == (num_classes,)
        and not assignment.is_floating_point()
        and torch.equal(assignment.sort().values, torch.arange(num_classes, device=assignment.device))
    )
    if not is_permutation:
        shown = assignment.tolist() if assignment.numel() <= 20 else f"a tensor of shape {tuple(assignment.shape)}"
        raise KdcollapseError(f"assignment must be a permutation of 0..{num_classes - 1}, got {shown}")
    return assignment.long()


def make_code(code: str | Tensor, num_classes: int, dim: int, *, key: str | None = None) -> Tensor:
    """A (K, d) code for :class:`FixedHead`: ``"softmax"``, ``"tammes"``, ``"etf"``, a file, or a tensor.

    ``"softmax"`` / ``"tammes"``: the closed form of GNC Thm 3.3 where it exists (:func:`closed_form_code`;
    for d = 2 the regular polygon with rows in angular order), else :func:`softmax_code` /
    :func:`tammes_code` (8 restarts, seed 0: the same code for every run). ``"etf"``: the simplex ETF
    (K <= d + 1). A path: a .npy, .safetensors or weights-only .pt matrix (``key`` names the tensor in a
    file holding several). Raises ``KdcollapseError`` unless the result is (K, d) with finite, non-zero rows.
    """
    if isinstance(code, Tensor):
        W = code
    elif code in ("softmax", "tammes"):
        W = closed_form_code(num_classes, dim)
        if W is None:
            W = (softmax_code if code == "softmax" else tammes_code)(num_classes, dim, restarts=8, seed=0).W
    elif code == "etf":
        W = simplex_etf(num_classes, dim)
    elif isinstance(code, str) and Path(code).suffix in SUFFIXES:
        W = load_matrix(code, key)
    else:
        raise KdcollapseError(unknown_choice("code", code, (*CODE_NAMES, "a .npy/.safetensors/.pt/.pth file")))
    W = unit_rows(W, "code")
    if W.shape != (num_classes, dim):
        raise KdcollapseError(
            f"code has shape {tuple(W.shape)}, but the model needs (K, d) = ({num_classes}, {dim}): "
            f"{num_classes} classes and feature dimension {dim}"
        )
    return W


def make_head(
    kind: str,
    in_features: int,
    num_classes: int,
    *,
    temperature: float = 0.1,
    beta: float = 0.9,
    code: str | Tensor | None = None,
    code_key: str | None = None,
    assignment: list[int] | Tensor | None = None,
) -> _SphericalHead:
    """A head of ``kind`` (``"cosine"``, ``"cmf"`` or ``"fixed"``) for (B, ``in_features``) features.

    ``beta`` is used by ``"cmf"``; ``code`` (see :func:`make_code`), ``code_key`` and ``assignment`` by
    ``"fixed"``, which needs ``code``.
    """
    if kind not in HEAD_KINDS:
        raise KdcollapseError(unknown_choice("head", kind, HEAD_KINDS))
    if kind == "cosine":
        return CosineHead(in_features, num_classes, temperature)
    if kind == "cmf":
        return ClassMeanFeatureHead(in_features, num_classes, beta, temperature)
    if code is None:
        raise KdcollapseError(f"a fixed head needs a code: one of {', '.join(CODE_NAMES)}, a file or a tensor")
    return FixedHead(make_code(code, num_classes, in_features, key=code_key), assignment, temperature)


def head_from_spec(spec: dict, state: dict[str, Tensor]) -> _SphericalHead:
    """Rebuild a head from its ``spec()`` and its state dict ``state`` (keys ``weight``, ``assignment``).

    Sizes come from ``state["weight"]``; a fixed head's code is ``weight`` put back in code order. The
    caller still loads ``state`` (a no-op for a fixed head, the trained rows for the others).
    """
    kind, weight = spec.get("kind") if isinstance(spec, dict) else spec, state.get("weight")
    if kind not in HEAD_KINDS:
        raise KdcollapseError(unknown_choice("head kind in the model file", kind, HEAD_KINDS))
    if not isinstance(weight, Tensor) or weight.ndim != 2:
        raise KdcollapseError(f"a '{kind}' head needs a (K, d) tensor head.weight in the state dict")
    num_classes, in_features = weight.shape
    temperature = spec.get("temperature", 0.1)
    if kind != "fixed":
        return make_head(kind, in_features, num_classes, temperature=temperature, beta=spec.get("beta", 0.9))
    if "assignment" not in state:
        raise KdcollapseError("a 'fixed' head needs the tensor head.assignment in the state dict")
    assignment = _check_assignment(state["assignment"], num_classes)
    return FixedHead(weight[assignment.argsort()], assignment, temperature)  # weight = code[assignment]


# Extra classifier heads a method trains beside the student's (a dual-head student's g′), described by layer
# so that a model file can carry them and a reader rebuild them without the method.
_LAYERS = {"Linear": lambda s: nn.Linear(s["in"], s["out"], bias=s["bias"]),
           "BatchNorm1d": lambda s: nn.BatchNorm1d(s["features"]),
           "Dropout": lambda s: nn.Dropout(s["p"]),
           "ReLU": lambda s: nn.ReLU()}


def layers_spec(module: nn.Module) -> list[dict] | None:
    """A JSON description of ``module`` as a list of layers (a ``Linear``, or a ``Sequential`` of
    ``Linear``/``BatchNorm1d``/``Dropout``/``ReLU``); ``None`` for any other module."""
    layers = list(module) if isinstance(module, nn.Sequential) else [module]
    spec = []
    for layer in layers:
        if isinstance(layer, nn.Linear):
            spec.append({"type": "Linear", "in": layer.in_features, "out": layer.out_features,
                         "bias": layer.bias is not None})
        elif isinstance(layer, nn.BatchNorm1d):
            spec.append({"type": "BatchNorm1d", "features": layer.num_features})
        elif isinstance(layer, nn.Dropout):
            spec.append({"type": "Dropout", "p": layer.p})
        elif isinstance(layer, nn.ReLU):
            spec.append({"type": "ReLU"})
        else:
            return None
    return spec


def layers_from_spec(spec: list[dict], state: dict[str, Tensor]) -> nn.Module:
    """The module :func:`layers_spec` described, with the weights ``state`` (keys as its ``state_dict``)."""
    try:
        layers = [_LAYERS[s["type"]](s) for s in spec]
    except (KeyError, TypeError):
        raise KdcollapseError(f"unknown extra-head description {spec!r}") from None
    module = layers[0] if len(layers) == 1 and not any(k[0].isdigit() for k in state) else nn.Sequential(*layers)
    module.load_state_dict(state)
    return module.eval()
