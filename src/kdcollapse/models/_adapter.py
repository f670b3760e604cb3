"""Any ``nn.Module`` as a :class:`Classifier`: the penultimate feature found by a *feature spec*.

The zoo's models already are ``Classifier``s (the fast path). Any other module whose logits come out of
a final ``nn.Linear`` classifier is wrapped in a :class:`ModuleClassifier`, its feature taken by

- ``"timm"``: timm's seams, ``forward_head(forward_features(x), pre_logits=True)``, classifier
  ``get_classifier()``;
- a layer name, e.g. ``"layer4"`` or ``"fc"``: captured with a forward hook; the output of that layer
  (averaged over any spatial dimensions), or, when the layer is the classifier itself, its input;
- a callable ``x -> (B, d)`` features.

With no spec, a timm-style module uses ``"timm"`` and any other the input of its last ``nn.Linear``.

``stages``: module paths (torchdistill's way, e.g. ``("layer1", "layer2.1.bn2")``) whose outputs
:meth:`~kdcollapse.models.Classifier.forward_intermediates` returns as maps, captured with forward hooks
in the same pass as the feature; ``feature_info`` is measured once on a zero input of ``input_shape``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from kdcollapse.errors import KdcollapseError
from kdcollapse.models._base import Classifier, FeatureInfo, Indices, evaluating, stage_indices

FeatureSpec = str | Callable[[torch.Tensor], torch.Tensor] | None
OPTIONS = ('features="timm" (forward_features + forward_head(pre_logits=True)), features="LAYER" (a layer '
           "captured with a forward hook, e.g. 'layer4', or the classifier 'fc' for its input), or "
           "features=callable(x) -> (B, d)")


def as_classifier(module: nn.Module, features: FeatureSpec = None, *, num_classes: int | None = None,
                  stages: Sequence[str] = (), input_shape: Sequence[int] | None = None) -> Classifier:
    """``module`` with the :class:`Classifier` seams (``forward_features``, ``forward_head``,
    ``forward_intermediates``, ``feature_info``, ``num_classes``, ``feature_dim``, ``head``); a
    ``Classifier`` given without a spec or stages is returned as is.

    ``features`` is the feature spec and ``stages`` the hooked stage layers, measured at ``input_shape``
    (C, H, W) (see the module docstring); ``num_classes``, if given, is checked against the classifier's
    outputs. Raises a ``KdcollapseError`` naming the options when the module has no recognisable classifier.
    """
    if isinstance(module, Classifier) and features is None and not stages:
        model = module
    elif isinstance(module, nn.Module):
        model = ModuleClassifier(module, features, stages=stages, input_shape=input_shape)
    else:
        raise KdcollapseError(f"expected an nn.Module, got {type(module).__name__}")
    if num_classes is not None and model.num_classes != num_classes:
        raise KdcollapseError(f"the model's classifier has {model.num_classes} outputs, expected {num_classes} classes")
    return model


def _is_timm_style(module: nn.Module) -> bool:
    return callable(getattr(module, "forward_features", None)) and callable(getattr(module, "forward_head", None))


def _module_name(root: nn.Module, target: nn.Module) -> str:
    for name, m in root.named_modules():
        if m is target:
            return name
    raise KdcollapseError(f"{type(target).__name__} is not a submodule of {type(root).__name__}")


def _last_linear(module: nn.Module, spec: object) -> str:
    names = [name for name, m in module.named_modules() if isinstance(m, nn.Linear)]
    if not names:
        raise KdcollapseError(
            f"cannot find the classifier of {type(module).__name__} (features={spec!r}): it has no nn.Linear "
            f"layer. Give {OPTIONS}, or subclass kdcollapse.models.Classifier"
        )
    return names[-1]


def _classifier_name(module: nn.Module, spec: object) -> str:
    if spec == "timm" and callable(getattr(module, "get_classifier", None)):
        head = module.get_classifier()
        if isinstance(head, nn.Linear):
            return _module_name(module, head)
    return _last_linear(module, spec)


class ModuleClassifier(Classifier):
    """A plain module behind the :class:`Classifier` seams; see :func:`as_classifier`.

    The state dict is the module's under ``module.``; the head is the module's own classifier (not a
    copy), so ``head`` reads and assigns that layer and ``forward`` is the module's own forward.
    """

    def __init__(self, module: nn.Module, features: FeatureSpec = None, *, stages: Sequence[str] = (),
                 input_shape: Sequence[int] | None = None):
        super().__init__()
        if features is None:
            features = "timm" if _is_timm_style(module) else _last_linear(module, None)
        if features == "timm" and not _is_timm_style(module):
            raise KdcollapseError(f"features='timm' needs forward_features and forward_head; "
                                  f"{type(module).__name__} lacks them. Other options: {OPTIONS}")
        if isinstance(features, str) and features != "timm":
            _submodule(module, features)  # fail early on a wrong name
        elif not isinstance(features, str) and not callable(features):
            raise KdcollapseError(f"unknown feature spec {features!r}; give {OPTIONS}")
        self.module = module
        object.__setattr__(self, "features", features)  # a spec that is a module must not be registered twice
        self._head_name = _classifier_name(module, features)
        self._verified = False  # see _verify
        head = _submodule(module, self._head_name)
        self.feature_dim, self.num_classes = head.in_features, head.out_features
        self._stages = tuple(stages)
        self.feature_info = self._measure_stages(input_shape) if self._stages else []

    def _measure_stages(self, input_shape: Sequence[int] | None) -> list[FeatureInfo]:
        """``feature_info`` of the hooked stages, from one eval-mode pass on zeros of ``input_shape``."""
        for name in self._stages:
            _submodule(self.module, name)
        if input_shape is None or len(input_shape) != 3:
            raise KdcollapseError(f"stages={list(self._stages)} needs input_shape=(C, H, W), the shape of one input "
                                  f"image, to measure each stage's channels and reduction; got {input_shape!r}")
        self.feature_info = [FeatureInfo(i, 0, 1, name) for i, name in enumerate(self._stages)]
        param = next(self.module.parameters(), None)
        x = torch.zeros(1, *input_shape, device=None if param is None else param.device)
        with evaluating([self]):
            _, maps = self.forward_intermediates(x)
        info = []
        for i, (name, m) in enumerate(zip(self._stages, maps)):
            if m.ndim != 4:
                raise KdcollapseError(f"stage {name!r} gives outputs of shape {tuple(m.shape)}, not (B, C, H, W) maps")
            info.append(FeatureInfo(i, m.shape[1], max(input_shape[1] // m.shape[2], 1), name))
        return info

    def forward_intermediates(self, x: torch.Tensor, indices: Indices = None, *,
                              pre_act: bool = False) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """The feature of the feature spec and the outputs of the hooked ``stages`` from one forward pass.
        ``pre_act`` cannot be honoured by hooks: name the layer before the activation in ``stages``."""
        if pre_act:
            raise KdcollapseError("pre_act=True: a module wrapped with stages= gives the outputs of the named "
                                  "layers; name the layer before the activation (e.g. its BatchNorm) instead")
        wanted = stage_indices(self.feature_info, indices)
        captured: dict[int, torch.Tensor] = {}
        handles = [_submodule(self.module, self._stages[i]).register_forward_hook(
            lambda _m, _inputs, output, i=i: captured.setdefault(i, output)) for i in wanted]
        try:
            h = self.forward_features(x)
        finally:
            for handle in handles:
                handle.remove()
        missing = [self._stages[i] for i in wanted if i not in captured]
        if missing:
            raise KdcollapseError(f"stage layer(s) {', '.join(missing)} did not run in the forward pass of the "
                                  f"features ({self.features!r})")
        return h, [captured[i] for i in wanted]

    @property
    def head(self) -> nn.Module:  # type: ignore[override]
        return _submodule(self.module, self._head_name)

    def __setattr__(self, name: str, value) -> None:
        if name == "head":  # replace the module's classifier in place (e.g. a spherical head)
            parent, _, leaf = self._head_name.rpartition(".")
            setattr(self.module.get_submodule(parent) if parent else self.module, leaf, value)
        else:
            super().__setattr__(name, value)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.module(x)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        spec = self.features
        if spec == "timm":
            h = self.module.forward_head(self.module.forward_features(x), pre_logits=True)
        elif callable(spec):
            h = spec(x)
        else:
            h = self._hooked(spec, x)
        return self._checked(h)

    def forward_head(self, h: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        return h if pre_logits else self.head(h)

    def reset_classifier(self, num_classes: int) -> None:
        self.head = nn.Linear(self.feature_dim, num_classes)
        self.num_classes = num_classes

    def _hooked(self, name: str, x: torch.Tensor) -> torch.Tensor:
        """Run the module, keeping layer ``name``'s input (if it is the classifier) or pooled output."""
        captured: dict[str, torch.Tensor] = {}
        layers = {"h": _submodule(self.module, name), "head": self.head}
        handles = [layer.register_forward_hook(lambda _m, inputs, output, key=key: captured.setdefault(
            key, inputs[0] if layers[key] is self.head else output)) for key, layer in layers.items()]
        try:
            self.module(x)
        finally:
            for handle in handles:
                handle.remove()
        h = captured["h"]
        h = h if h.ndim <= 2 or name == self._head_name else h.flatten(2).mean(2)
        if not self._verified and not self.module.training and h.shape == captured["head"].shape:
            self._verify(name, h, captured["head"])
        return h

    def _verify(self, name: str, h: torch.Tensor, head_input: torch.Tensor) -> None:
        """Once, in eval mode: the layer's pooled output is what the classifier receives."""
        if not torch.allclose(h.float(), head_input.float(), rtol=1e-3, atol=1e-5):
            raise KdcollapseError(
                f"the output of layer {name!r} (averaged over space) is not the input of the classifier "
                f"'{self._head_name}' (an activation or another layer follows it); name the layer whose output "
                f"feeds the classifier, or the classifier itself. Options: {OPTIONS}"
            )
        object.__setattr__(self, "_verified", True)

    def _checked(self, h: torch.Tensor) -> torch.Tensor:
        if h.ndim != 2 or h.shape[1] != self.feature_dim:
            raise KdcollapseError(
                f"features={self.features!r} gives features of shape {tuple(h.shape)}, but the classifier "
                f"'{self._head_name}' takes (B, {self.feature_dim}); name the layer that feeds the classifier. "
                f"Options: {OPTIONS}"
            )
        return h


def _submodule(module: nn.Module, name: str) -> nn.Module:
    try:
        return module.get_submodule(name)
    except AttributeError:
        layers = [n for n, _ in module.named_children()]
        raise KdcollapseError(
            f"{type(module).__name__} has no layer {name!r}; its top-level layers: {', '.join(layers)}"
        ) from None


def adapt_state_dict(model: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """``state`` keyed for ``model``: a wrapped module's own state dict (keys without ``module.``) gets
    the wrapper's prefix; anything else is returned unchanged."""
    if isinstance(model, ModuleClassifier) and state and not any(k.startswith("module.") for k in state):
        return {f"module.{k}": v for k, v in state.items()}
    return state
