"""The loss catalogue: every loss function of ``kdcollapse.losses`` declared once, beside its code.

A declaration (``@register_loss(...)`` above the function) says what the loss reads (its ``kind``),
where it comes from (paper and equation), which of the shared options it takes (temperature, (B, T, V)
sequence logits with a mask, ``ignore_index``, ``chunk_size``) and how a contract test calls it (its
``example`` arguments). The contract tests (bad input, half precision against float64, LLM shapes and
masks, chunked = unchunked, ``torch.compile(fullgraph=True)``) are parametrised over
:func:`list_losses`, so a declared loss is covered by all of them, and a test fails when a loss
exported from ``kdcollapse.losses`` is not declared.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

from kdcollapse._registry import Registry
from kdcollapse.errors import KdcollapseError, unknown_choice
from kdcollapse.losses._divergence import Divergence, divergence_loss

KINDS = ("logits", "logits+target", "features", "tokens")
"""``logits``: two (B, K) or (B, T, K) logit tensors; ``logits+target``: the same and labels;
``features``: embeddings or feature maps; ``tokens``: language-model hidden states and a head."""

Arguments = Callable[[int, Tensor], dict[str, Any]]


@dataclass(frozen=True)
class LossCase:
    """One way the contract tests call a logit loss: ``arguments(K, labels)`` are the keyword
    arguments besides the two logit tensors and ``mask`` (``target`` among them when the case
    uses labels). ``k_squared``: the call holds O(K²) memory (a K×K table or Gram matrix), so tests
    keep K ≤ 1000."""

    label: str
    arguments: Arguments
    k_squared: bool = False


@dataclass(frozen=True)
class LossInfo:
    """What a loss is and how to call it. ``temperature``, ``sequences`` ((B, T, V) logits with a
    (B, T) mask), ``ignore_index`` and ``chunked`` (``chunk_size``) say which shared options the
    function takes; ``tests/test_losses_catalog.py`` checks them against its signature."""

    def __repr__(self) -> str:  # one line: list_losses() reads as a list, not 33 screens of fields
        return f"LossInfo({self.name!r}, kind={self.kind!r}, paper={self.paper!r})"

    name: str
    function: Callable[..., Tensor]
    kind: str
    paper: str
    equation: str
    temperature: bool
    sequences: bool
    ignore_index: bool
    chunked: bool
    cases: tuple[LossCase, ...] = ()
    inputs: Callable[[], tuple[Tensor, ...]] | None = None
    reference_first: bool = False
    checks_values: bool = True
    compiles: bool = True
    notes: str = ""
    divergence: Divergence | None = None  # a token divergence: its per-row formula and named parameters
    reference: Callable[..., Tensor] | None = None  # what it must equal: a slow implementation of the paper

    def arguments(self, student: Tensor, teacher: Tensor, target: Tensor,
                  case: LossCase | None = None) -> tuple[tuple[Tensor, Tensor], dict[str, Any]]:
        """The positional and keyword arguments of a logit loss on the fitted side ``student`` and
        the reference side ``teacher`` (passed first when ``reference_first``), with ``target``
        when the case uses labels."""
        case = case or self.cases[0]
        pair = (teacher, student) if self.reference_first else (student, teacher)
        return pair, case.arguments(student.shape[-1], target)

    def call(self, student: Tensor, teacher: Tensor, target: Tensor, mask: Tensor | None = None,
             case: LossCase | None = None, **options: Any) -> Tensor:
        """The loss on :meth:`arguments`, with ``mask``; ``options`` override the case's arguments."""
        pair, arguments = self.arguments(student, teacher, target, case)
        if self.sequences:
            arguments["mask"] = mask
        elif mask is not None:
            raise KdcollapseError(f"loss {self.name!r} takes no mask (it needs the whole batch)")
        return self.function(*pair, **{**arguments, **options})


_LOSSES: Registry[LossInfo] = Registry("loss")


def register_loss(name: str, *, kind: str, paper: str, equation: str, temperature: bool,
                  sequences: bool, ignore_index: bool, chunked: bool,
                  example: Arguments | None = None, variants: Mapping[str, Arguments] = {},
                  k_squared: tuple[str, ...] = (), inputs: Callable[[], tuple[Tensor, ...]] | None = None,
                  reference_first: bool = False, checks_values: bool = True, compiles: bool = True,
                  notes: str = "", divergence: Divergence | None = None,
                  reference: Callable[..., Tensor] | None = None,
                  ) -> Callable[[Callable[..., Tensor]], Callable[..., Tensor]]:
    """Declare the decorated loss function (returned unchanged) under ``name``.

    Logit kinds give ``example(K, labels)`` (the keyword arguments of a typical call) and, for other
    code paths worth testing, ``variants`` {label: arguments}; ``k_squared`` names the cases that hold
    O(K²) memory, a K×K table or Gram matrix ("" is ``example``); ``reference_first``: the function takes the
    reference side (teacher, natural image) before the fitted side. Other kinds give ``inputs()``:
    the positional float64 tensors of a small call (integer tensors for labels).

    ``reference``: what the loss must equal, an independent slow implementation from the paper's
    definition (a closed form, or loops; see ``kdcollapse/losses/_references.py``) taking the same
    arguments as the example's call (the two logit tensors in the function's order and the case's keyword
    arguments, or ``inputs()``); tests/test_loss_references.py compares value and the fitted side's
    gradient in float64 on random inputs, for every case, and refuses a loss declared without one.

    ``divergence``: the loss is a token divergence (:class:`~kdcollapse.losses._divergence.Divergence`),
    which the language-model paths read. With ``divergence.rows=None`` the decorated function is its
    per-row formula ``rows(log_q, log_p, **parameters)`` (returned unchanged) and the declared loss is the
    generated :func:`~kdcollapse.losses._divergence.divergence_loss`; with ``rows`` given, the decorated
    function is the loss as for any other declaration.
    """
    if kind not in KINDS:
        raise KdcollapseError(unknown_choice("loss kind", kind, KINDS))
    logits = kind.startswith("logits")
    if logits != (example is not None) or logits == (inputs is not None):
        raise KdcollapseError(f"loss {name!r} of kind {kind!r} needs "
                              + ("example= and no inputs=" if logits else "inputs= and no example="))
    cases = tuple(LossCase(label, arguments, label in k_squared)
                  for label, arguments in ({"": example, **variants} if logits else {}).items())

    def decorator(function: Callable[..., Tensor]) -> Callable[..., Tensor]:
        loss, declared = function, divergence
        if divergence is not None and divergence.rows is None:  # the decorated function is the formula
            declared = replace(divergence, rows=function)
            loss = divergence_loss(name, declared)
        info = LossInfo(name, loss, kind, paper, equation, temperature, sequences,
                        ignore_index, chunked, cases, inputs, reference_first, checks_values,
                        compiles, notes, declared, reference)
        _LOSSES.register(name)(info)
        return function

    return decorator


def get_loss(name: str | LossInfo) -> LossInfo:
    """The declaration of loss ``name`` (or of what :func:`list_losses` returned); an unknown name lists the
    declared ones."""
    return _LOSSES.get(name.name if isinstance(name, LossInfo) else name)


def list_losses(kind: str | Sequence[str] | None = None) -> list[LossInfo]:
    """Every declared loss (of ``kind``, one of :data:`KINDS`, or a list of kinds), by name."""
    kinds = KINDS if kind is None else (kind,) if isinstance(kind, str) else tuple(kind)
    for k in kinds:
        if k not in KINDS:
            raise KdcollapseError(unknown_choice("loss kind", k, KINDS))
    return [info for info in map(_LOSSES.get, _LOSSES.names()) if info.kind in kinds]


def class_table(k: int) -> Tensor:
    """A fixed row-stochastic K×K float64 table (row y: mean probabilities of class y), for
    the examples of losses that take ``class_weights``."""
    g = torch.Generator().manual_seed(k)
    return torch.softmax(torch.randn(k, k, generator=g, dtype=torch.float64), -1)


def example_tensors(*shapes: tuple[int, ...], seed: int = 0) -> tuple[Tensor, ...]:
    """Standard-normal float64 tensors of ``shapes`` from a fixed seed (the ``inputs`` of
    feature losses)."""
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g, dtype=torch.float64) for shape in shapes)

