"""Thin ``nn.Module`` wrappers generated from the pure loss functions.

A wrapper stores a loss function's hyperparameters (the arguments with int/float/str defaults:
weights, temperature, ``ignore_index``, ``reduction``) and forwards everything else:
``KDLoss(temperature=2.0)(student, teacher, mask=m)`` is
``kd_loss(student, teacher, temperature=2.0, mask=m)``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import Tensor, nn


class LossModule(nn.Module):
    """Base of the generated wrappers; ``loss_fn`` and ``hyperparameters`` are set per subclass."""

    loss_fn: Callable[..., Tensor]
    hyperparameters: inspect.Signature

    def __init__(self, *args: Any, **kwargs: Any):
        """Bind the hyperparameters (positionally or by name; unset ones take their defaults)."""
        super().__init__()
        bound = self.hyperparameters.bind(*args, **kwargs)
        bound.apply_defaults()
        self.config = dict(bound.arguments)

    def forward(self, *args: Any, **kwargs: Any) -> Tensor:
        """The loss function on the given tensors with the stored hyperparameters."""
        return type(self).loss_fn(*args, **self.config, **kwargs)

    def extra_repr(self) -> str:
        return ", ".join(f"{k}={v}" for k, v in self.config.items())


def loss_module(name: str, loss_fn: Callable[..., Tensor]) -> type[LossModule]:
    """A ``LossModule`` subclass ``name`` whose constructor takes ``loss_fn``'s hyperparameters."""
    hyper = [inspect.Parameter(p.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=p.default)
             for p in inspect.signature(loss_fn).parameters.values()
             if isinstance(p.default, (int, float, str)) and not isinstance(p.default, bool)]
    signature = inspect.Signature(hyper)
    doc = (f"Module form of :func:`{loss_fn.__name__}`: ``{name}{signature}``.\n\n"
           + inspect.cleandoc(loss_fn.__doc__ or ""))
    return type(name, (LossModule,), {
        "loss_fn": staticmethod(loss_fn), "hyperparameters": signature, "__doc__": doc,
        "__module__": __package__,  # where the wrappers are bound, so pickling finds them
    })

