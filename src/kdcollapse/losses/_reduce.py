"""What every logit loss shares past input validation: the accumulation dtype, the positions that
count (``mask`` and ``ignore_index``), the reduction, the validation switch and row chunking.

A loss turns its logits into :class:`Samples` with :func:`logit_samples`, computes one value per
row with :meth:`Samples.per_row` (upcast to the accumulation dtype there, optionally chunk by chunk)
and reduces the values with :meth:`Samples.reduce`.

Two ways to select positions:

* validated (the default): one device read-back checks the values and tells whether any position
  is dropped; if so the kept rows are gathered (``x[keep]``), so dropped rows cost nothing;
* unvalidated (``validate=False`` or inside ``with validation(False)``): no read-back at all, so
  ``torch.compile(fullgraph=True)`` can trace the loss. Every row is computed and the dropped ones
  are zeroed with ``torch.where``; their logits must then be finite (their gradient is 0 only if
  they are) and an empty selection gives a mean of NaN (0 / 0), as ``F.cross_entropy`` does.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator, Mapping, Sequence

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses._shapes import check_tensor, check_values, describe

IGNORE_INDEX = -100  # the label PyTorch's cross-entropy and Hugging Face models skip
REDUCTIONS = ("mean", "sum", "none")
_validate = True


@contextlib.contextmanager
def validation(enabled: bool) -> Iterator[None]:
    """Turn the value checks of every loss on or off inside the block (per call: ``validate=``).

    With checks off a loss makes no host synchronisation (no ``.item()``/``.tolist()``, no boolean
    indexing), which ``torch.compile(fullgraph=True)`` and CUDA graphs need. Shape and dtype
    checks stay on: they read no values.
    """
    global _validate
    previous, _validate = _validate, bool(enabled)
    try:
        yield
    finally:
        _validate = previous


def validating(validate: bool | None) -> bool:
    """``validate`` if given, else the setting of the innermost :func:`validation` block."""
    return _validate if validate is None else validate


def check_reduction(reduction: str) -> None:
    if reduction not in REDUCTIONS:
        raise KdcollapseError(f"reduction must be one of {', '.join(REDUCTIONS)}, "
                              f"got {reduction!r}")


def accumulation_dtype(*xs: Tensor) -> torch.dtype:
    """The promoted dtype of ``xs``, at least float32: half and bfloat16 accumulate in float32."""
    return torch.promote_types(functools.reduce(torch.promote_types, (x.dtype for x in xs)),
                               torch.float32)


def slice_vocab(named: Mapping[str, Tensor], vocab_size: int | None) -> dict[str, Tensor]:
    """Each logit tensor cut to its first ``vocab_size`` classes (padded vocabularies)."""
    if vocab_size is None:
        return dict(named)
    sizes = {name: x.shape[-1] for name, x in named.items()}
    if not (isinstance(vocab_size, int) and 0 < vocab_size <= min(sizes.values())):
        listed = ", ".join(f"{name} has {k}" for name, k in sizes.items())
        raise KdcollapseError(f"vocab_size must be an int in [1, smallest class count] ({listed}), "
                              f"got {vocab_size!r}")
    return {name: x[..., :vocab_size] for name, x in named.items()}


def constants(*values: object) -> bool:
    """Whether every one of ``values`` is a plain number (not a tensor: a learned or per-row temperature)."""
    return all(isinstance(v, (int, float)) for v in values)


def scaled_logits(x: Tensor, dtype: torch.dtype, temperature: float) -> Tensor:
    """``x / temperature`` in ``dtype``, as one new tensor (an upcast copy is divided in place)."""
    return x.to(dtype).div_(temperature) if x.dtype != dtype else x / temperature


def check_mask(mask: object, lead: tuple[int, ...]) -> Tensor:
    if (not isinstance(mask, Tensor) or tuple(mask.shape) != lead
            or mask.dtype.is_floating_point or mask.dtype.is_complex):
        raise KdcollapseError(f"mask must be a bool or integer (0/1) tensor of shape {lead}, "
                              f"got {describe(mask)}")
    return mask


def check_target(target: object, lead: tuple[int, ...]) -> Tensor:
    if (not isinstance(target, Tensor) or target.dtype.is_floating_point
            or target.dtype == torch.bool):
        raise KdcollapseError(f"target must be an integer tensor of class indices, got "
                              f"{describe(target)}")
    if tuple(target.shape) != lead:
        raise KdcollapseError(f"target must have shape {lead} to match the logits, "
                              f"got {tuple(target.shape)}")
    return target


class Samples:
    """Validated (N, K) rows of one loss call and how to reduce values computed on them.

    ``logits`` keep their input dtype (upcast happens per row block in :meth:`per_row`);
    ``target`` is (N,) or None; ``kept`` (leading shape, bool) are the positions gathered into the
    rows (None: all of them, in order); ``weights`` (N,) bool marks the rows that count when every
    row was kept for lack of a read-back (None: all count).
    """

    def __init__(self, logits: list[Tensor], target: Tensor | None, lead: tuple[int, ...],
                 kept: Tensor | None, weights: Tensor | None):
        self.logits, self.target, self.lead = logits, target, lead
        self.kept, self.weights = kept, weights
        self.dtype = accumulation_dtype(*logits)

    def per_row(self, fn: Callable[..., Tensor | tuple[Tensor, ...]], *extra: Tensor,
                chunk_size: int | None = None) -> Tensor | tuple[Tensor, ...]:
        """``fn(*logits upcast to self.dtype, *extra)`` → (N,) values or a tuple of them.

        ``extra`` are further per-row tensors (labels, weights), passed as they are. With
        ``chunk_size`` the rows are processed ``chunk_size`` at a time and recomputed in the
        backward pass, so no (N, K) intermediate of ``fn`` is ever held: peak memory beyond the
        inputs and their gradients is that of one chunk. Values are the unchunked ones.
        """
        if chunk_size is not None and not (isinstance(chunk_size, int) and chunk_size > 0):
            raise KdcollapseError(f"chunk_size must be a positive int or None, got {chunk_size!r}")
        if chunk_size is None or chunk_size >= self.logits[0].shape[0]:
            return fn(*(x.to(self.dtype) for x in self.logits), *extra)
        return _RowChunks.apply(fn, self.dtype, chunk_size, len(self.logits), *self.logits, *extra)

    def reduce(self, values: Tensor, reduction: str) -> Tensor:
        """Mean or sum over the kept rows, or (reduction "none") the values in the logits' leading
        shape, 0 at dropped positions."""
        if self.weights is not None:
            values = torch.where(self.weights, values, 0)
        if reduction == "mean":
            return values.mean() if self.weights is None else values.sum() / self.weights.sum()
        if reduction == "sum":
            return values.sum()
        if self.kept is None:
            return values.reshape(self.lead)
        return values.new_zeros(self.lead).index_put((self.kept,), values)


def logit_samples(named: Mapping[str, Tensor], target: Tensor | None = None,
                  mask: Tensor | None = None, *, ignore_index: int = IGNORE_INDEX,
                  vocab_size: int | None = None, validate: bool | None = None,
                  reduction: str = "mean") -> Samples:
    """Validate logits of shape (B, K) or (B, T, K) and return their kept positions as rows.

    ``named`` maps argument names (used in error messages) to logits of one common shape, cut to
    ``vocab_size`` classes first if given. ``target`` (integer labels) and ``mask`` (bool or 0/1
    integers, True/1 = use the position) have the logits' leading shape; a position is kept when
    its mask is set and its label is not ``ignore_index``. Labels are range-checked only where kept.
    """
    check_reduction(reduction)
    for name, x in named.items():
        check_tensor(name, x, (2, 3))
    named = slice_vocab(named, vocab_size)
    (first_name, first), *rest = named.items()
    lead, num_classes = tuple(first.shape[:-1]), first.shape[-1]
    for name, x in rest:
        if x.shape[:-1] == first.shape[:-1] and x.shape[-1] != num_classes:
            raise KdcollapseError(
                f"class counts differ: {first_name} has K = {num_classes} classes, {name} has "
                f"K = {x.shape[-1]} (padded vocabularies: pass vocab_size= to use the first "
                f"classes)")
        if x.shape != first.shape:
            raise KdcollapseError(
                f"shapes differ: {first_name} {tuple(first.shape)} vs {name} {tuple(x.shape)}")
    keep = None if mask is None else check_mask(mask, lead).bool()
    if target is not None:
        labelled = check_target(target, lead) != ignore_index
        keep = labelled if keep is None else keep & labelled
    flat = [x.reshape(-1, num_classes) for x in named.values()]
    flat_target = None if target is None else target.reshape(-1)
    if not validating(validate):
        if keep is None:
            return Samples(flat, flat_target, lead, None, None)
        weights = keep.reshape(-1)
        if flat_target is not None:
            flat_target = torch.where(weights, flat_target, 0)  # ignored labels must still gather
        return Samples(flat, flat_target, lead, None, weights)
    everything = check_values(named, target, num_classes, keep, mask)
    if keep is None or everything:
        return Samples(flat, flat_target, lead, None, None)
    return Samples([x[keep] for x in named.values()], None if target is None else target[keep],
                   lead, keep, None)


class _RowChunks(torch.autograd.Function):
    """Per-row values computed ``chunk_size`` rows at a time, recomputed chunk by chunk backward.

    Only the inputs are saved (the caller holds them anyway); each gradient is written into its
    slice of one preallocated tensor of the input's dtype.
    """

    @staticmethod
    def forward(ctx, fn, dtype, chunk_size, n_logits, *tensors):
        ctx.fn, ctx.dtype, ctx.chunk_size, ctx.n_logits = fn, dtype, chunk_size, n_logits
        ctx.save_for_backward(*tensors)
        with torch.no_grad():
            parts = [_call(fn, dtype, n_logits, chunk) for chunk in _chunks(tensors, chunk_size)]
        ctx.single = isinstance(parts[0], Tensor)
        if ctx.single:
            return torch.cat(parts)
        return tuple(torch.cat(column) for column in zip(*parts))

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_values):
        tensors = ctx.saved_tensors
        wanted = [i for i in range(ctx.n_logits) if ctx.needs_input_grad[4 + i]]
        grads: list[Tensor | None] = [None] * len(tensors)
        for i in wanted:
            grads[i] = torch.zeros_like(tensors[i])
        start = 0
        for chunk in _chunks(tensors, ctx.chunk_size):
            stop = start + chunk[0].shape[0]
            inputs = [chunk[i].detach().requires_grad_() for i in wanted]
            chunk = list(chunk)
            for i, x in zip(wanted, inputs):
                chunk[i] = x
            with torch.enable_grad():
                values = _call(ctx.fn, ctx.dtype, ctx.n_logits, chunk)
                values = (values,) if ctx.single else values
                found = torch.autograd.grad(values, inputs, [g[start:stop] for g in grad_values],
                                            allow_unused=True)
            for i, g in zip(wanted, found):
                if g is not None:
                    grads[i][start:stop] = g
            start = stop
        return (None, None, None, None, *grads)


def _chunks(tensors: Sequence[Tensor], size: int) -> Iterator[tuple[Tensor, ...]]:
    for start in range(0, tensors[0].shape[0], size):
        yield tuple(x[start:start + size] for x in tensors)


def _call(fn, dtype, n_logits, chunk):
    return fn(*(x.to(dtype) for x in chunk[:n_logits]), *chunk[n_logits:])
