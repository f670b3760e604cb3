"""Token divergences: the part of a loss declaration (``register_loss(..., divergence=Divergence(...))``)
that the language-model paths read.

A token divergence is a function of each row's student and teacher log-probabilities (and, for some, the
row's target token) with named scalar parameters (GKD's ``beta``, DistiLLM's ``alpha``). Declaring one
with :func:`kdcollapse.losses._catalog.register_loss` is all it takes: the unfused logit loss
(``token_divergence`` and the generated ``<name>_loss`` function), the loss fused with the student's head
(``fused_head_loss``), the loss on stored top-k teacher tokens, ``distill-lm``'s ``loss.divergence``
choices and ``loss.<parameter>`` keys, the contract tests and the docs table all read the declaration.
See docs/ARCHITECTURE.md, "Adding a token divergence".
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import KdcollapseError

# keyword names of the generated loss functions and of fused_head_loss: no parameter may take one of them
RESERVED = frozenset({"student", "teacher", "target", "temperature", "mask", "reduction", "vocab_size",
                      "chunk_size", "validate", "hidden", "weight", "labels", "ce_weight", "distill_weight",
                      "ignore_index", "divergence", "parameters"})


@dataclass(frozen=True)
class Parameter:
    """A named scalar parameter of a divergence: its default and its closed range [low, high] (``high`` may
    be ``math.inf``: then any finite number >= low)."""

    default: float
    low: float = 0.0
    high: float = 1.0
    meaning: str = ""

    def describe(self) -> str:
        return f"a number >= {self.low:g}" if self.high == math.inf else f"a number in [{self.low:g}, {self.high:g}]"

    def check(self, name: str, divergence: str, value) -> float:
        # comparisons only (no math.isfinite): torch.compile traces them on a float it made symbolic; NaN fails
        ok = (isinstance(value, (int, float)) and not isinstance(value, bool) and self.low <= value <= self.high
              and (self.high < math.inf or value < math.inf))
        if not ok:
            raise KdcollapseError(f"{name} of {divergence} must be {self.describe()}, got {value!r}")
        return float(value)


@dataclass(frozen=True)
class Divergence:
    """What makes a declared loss a token divergence: ``rows(log_q, log_p, **parameters)`` (or
    ``rows(log_q, log_p, target, **parameters)`` when ``target``) gives the (N,) per-row values from the
    student's log-probabilities ``log_q`` and the teacher's ``log_p`` (N, V), with no τ² factor; the named
    ``parameters`` and their ranges. ``rows=None`` in a declaration: the decorated function is ``rows``.

    ``gradient`` (optional, target-free divergences): ``gradient(log_q, log_p, **parameters) -> (values, g)``,
    the (N,) values of ``rows`` and g (N, V) = ∂values / ∂log_q with every entry of ``log_q`` taken as free; the
    loss fused with the head then forms the logits' gradient as g − q Σ g without autograd (fewer passes over
    each (chunk, V) block). Tested against ``rows`` and its autograd gradient (``tests/test_losses_fused.py``).

    ``f_divergence``: the rows are an f-divergence, Σ_v q_v f(p_v / q_v). Then its value on distributions coarsened
    to a partition (stored top-k tokens with the rest as one outcome: ``TopKTeacher`` tail "rest") equals its value
    against the teacher whose rest's mass follows the student's own shape there, p_j = rest · q_j / Σ_rest q, and
    so does the gradient with that teacher held fixed (∂D/∂p_j = f′(rest / Σ_rest q) is one number over the rest,
    whose mass does not move with q): the fused loss then takes the declared ``gradient``
    (``tests/test_losses_fused_tail.py`` checks it against autograd through the coarsened rows)."""

    rows: Callable[..., Tensor] | None = None
    parameters: Mapping[str, Parameter] = field(default_factory=dict)
    target: bool = False
    gradient: Callable[..., tuple[Tensor, Tensor]] | None = None
    f_divergence: bool = False

    def __post_init__(self):
        bad = next((k for k in self.parameters if not k.isidentifier()), None)
        if bad is not None:
            raise KdcollapseError(f"divergence parameter {bad!r} must be a Python identifier (it is a keyword argument)")
        taken = sorted(set(self.parameters) & RESERVED)
        if taken:
            raise KdcollapseError(f"divergence parameter {taken[0]!r} clashes with a keyword of the loss functions; "
                                  "choose another name")

    def bind(self, name: str, given: Mapping[str, float | None], *, unset: bool = True) -> Callable[..., Tensor]:
        """``rows`` with its parameters bound: each of ``given`` checked against its range (a missing one, or
        with ``unset`` one given as ``None``, takes its default); a name the divergence does not take is an
        error naming those it takes."""
        unknown = sorted(set(given) - set(self.parameters))
        if unknown:
            takes = ", ".join(self.parameters) or "no parameter"
            raise KdcollapseError(f"divergence {name!r} takes {takes}, not {unknown[0]!r}")
        values = {key: p.default if key not in given or (unset and given[key] is None) else p.check(key, name, given[key])
                  for key, p in self.parameters.items()}
        rows = self.rows
        return (lambda log_q, log_p, target: rows(log_q, log_p, target, **values)) if self.target else (
            lambda log_q, log_p: rows(log_q, log_p, **values))

    def bind_gradient(self, name: str, given: Mapping[str, float | None]) -> Callable[..., tuple[Tensor, Tensor]] | None:
        """``gradient`` with its parameters bound as :meth:`bind` binds them; None when none is declared."""
        if self.gradient is None or self.target:
            return None
        self.bind(name, given)  # the same checks
        values = {key: p.default if given.get(key) is None else float(given[key]) for key, p in self.parameters.items()}
        gradient = self.gradient
        return lambda log_q, log_p: gradient(log_q, log_p, **values)


def tempered_rows(rows: Callable[[Tensor, Tensor], Tensor], student: Tensor, teacher: Tensor, temperature: float, *,
                  mask: Tensor | None, reduction: str, vocab_size: int | None, chunk_size: int | None,
                  validate: bool | None) -> Tensor:
    """``rows(log_softmax(student / τ), log_softmax(teacher / τ))`` over the kept tokens of logits (B, K) or
    (B, T, K), reduced by ``reduction``: every unfused token divergence (:func:`divergence_loss`,
    ``kdcollapse.losses.llm.token_divergence``)."""
    from kdcollapse.losses._reduce import logit_samples
    from kdcollapse.losses._shapes import check_positive

    check_positive("temperature", temperature)
    samples = logit_samples({"student": student, "teacher": teacher}, mask=mask, vocab_size=vocab_size,
                            validate=validate, reduction=reduction)
    values = samples.per_row(lambda s, t: rows(F.log_softmax(s / temperature, -1),
                                               F.log_softmax(t / temperature, -1)), chunk_size=chunk_size)
    return samples.reduce(values, reduction)


def divergence_loss(name: str, divergence: Divergence) -> Callable[..., Tensor]:
    """The unfused loss function of a declared divergence (``target``-free ones): ``f(student, teacher,
    <parameters...>, temperature=1.0, *, mask=None, reduction="mean", vocab_size=None, chunk_size=None,
    validate=None)``, the mean over kept tokens of the divergence between softmax(teacher / τ) and
    softmax(student / τ); its signature lists the declared parameters by name, with their defaults."""
    def run(student, teacher, given, temperature, mask, reduction, vocab_size, chunk_size, validate) -> Tensor:
        return tempered_rows(divergence.bind(name, given, unset=False), student, teacher, temperature, mask=mask,
                             reduction=reduction, vocab_size=vocab_size, chunk_size=chunk_size, validate=validate)

    if not name.isidentifier():
        raise KdcollapseError(f"token divergence {name!r}: its name must be a Python identifier ({name}_loss)")
    # a plain def (not *args parsing), so that torch.compile(fullgraph=True) traces it like a written one
    keys = list(divergence.parameters)
    source = (f"def {name}_loss(student, teacher, " + "".join(f"{k}={divergence.parameters[k].default!r}, " for k in keys)
              + "temperature=1.0, *, mask=None, reduction='mean', vocab_size=None, chunk_size=None, validate=None):\n"
              + "    return run(student, teacher, {" + ", ".join(f"{k!r}: {k}" for k in keys) + "}, temperature, mask, "
              "reduction, vocab_size, chunk_size, validate)\n")
    namespace: dict = {"run": run}
    exec(compile(source, f"<token divergence {name}>", "exec"), namespace)  # noqa: S102 (names from a declaration)
    loss = namespace[f"{name}_loss"]
    params = "".join(f", {key}={p.default:g}" for key, p in divergence.parameters.items())
    loss.__doc__ = (f"Mean over kept tokens of the declared token divergence ``{name}`` (``{name}_loss(student, "
                    f"teacher{params}, temperature=1.0, *, mask, reduction, vocab_size, chunk_size, validate)``), "
                    f"no τ² factor; see ``kdcollapse.losses.get_loss({name!r})``.")
    loss.__module__ = "kdcollapse.losses.llm"
    return loss
