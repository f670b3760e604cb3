"""``Metric``: the torchmetrics protocol, without importing torchmetrics.

A metric declares its states with ``add_state(name, default, dist_reduce_fx)``; ``update`` adds a batch,
``compute`` turns the states into numbers (gathered across processes first when ``sync_on_compute``),
``reset`` restores the defaults, ``merge_state`` adds another metric's states, and ``sync`` / ``unsync`` /
``sync_context`` reduce every state over ``torch.distributed`` (``"sum"``, ``"mean"``, ``"max"``, ``"min"``,
``"cat"`` or a function of the states stacked along a new first dimension). The names, signatures and
semantics are torchmetrics' (``torchmetrics.Metric``, 1.x), so a subclass reads as a torchmetrics metric.

Why not torchmetrics itself: importing any of its modules runs ``torchmetrics/__init__``, which loads
``transformers`` (``functional.text.bert``), ``scipy.signal`` (audio) and matplotlib (``utilities.plot``):
55 % of the CPU time of ``import kdcollapse.train`` (issue 42; ``benchmarks/bench_import.py``).

Differences, all deliberate: unknown constructor options are errors (torchmetrics raises ``ValueError`` as
well); ``forward`` always evaluates the batch alone by a full update (torchmetrics' ``full_state_update``
path), whatever ``full_state_update`` says; ``half()``, ``float()``, ``double()``, ``bfloat16()`` and
``type()`` keep the states' dtypes as torchmetrics does, and ``set_dtype`` converts only floating-point
states (torchmetrics converts every state, counts included).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from copy import deepcopy
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from kdcollapse.errors import KdcollapseError

_REDUCTIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "sum": lambda stacked: stacked.sum(0),
    "mean": lambda stacked: stacked.mean(0),
    "max": lambda stacked: stacked.amax(0),
    "min": lambda stacked: stacked.amin(0),
}
OPTIONS = ("sync_on_compute", "dist_sync_fn", "process_group", "distributed_available_fn", "compute_with_cache")


def distributed_available() -> bool:
    return dist.is_available() and dist.is_initialized()


def gather_all_tensors(tensor: Tensor, group: Any = None) -> list[Tensor]:
    """Every rank's ``tensor`` (a list indexed by rank), shapes allowed to differ between ranks; ``[tensor]``
    without a process group."""
    if not distributed_available():
        return [tensor]
    tensor = tensor.contiguous()
    world = dist.get_world_size(group)
    shape = torch.tensor(tensor.shape, dtype=torch.int64, device=tensor.device)
    shapes = [torch.zeros_like(shape) for _ in range(world)]
    dist.all_gather(shapes, shape, group=group)
    if all(torch.equal(s, shape) for s in shapes):
        out = [torch.empty_like(tensor) for _ in range(world)]
        dist.all_gather(out, tensor, group=group)
        return out
    # Uneven shapes: pad every rank's tensor to the largest extent along each dimension, gather, cut back.
    largest = torch.stack(shapes).amax(0).tolist()
    padded = tensor.new_zeros(largest)
    padded[tuple(slice(0, n) for n in tensor.shape)] = tensor
    out = [torch.empty_like(padded) for _ in range(world)]
    dist.all_gather(out, padded, group=group)
    return [t[tuple(slice(0, int(n)) for n in s)] for t, s in zip(out, shapes)]


def _counted_update(update: Callable) -> Callable:
    @functools.wraps(update)
    def wrapped(self: Metric, *args: Any, **kwargs: Any) -> None:
        self._computed = None
        self._update_count += 1
        with torch.no_grad():
            update(self, *args, **kwargs)

    return wrapped


def _cached_compute(compute: Callable) -> Callable:
    @functools.wraps(compute)
    def wrapped(self: Metric) -> Any:
        if self._update_count == 0:  # as torchmetrics: legal (merge_state fills a metric too), often a mistake
            warnings.warn(f"{type(self).__name__}.compute() was called before update()", UserWarning, stacklevel=2)
        if self._computed is not None:
            return self._computed
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self.sync_on_compute):
            value = compute(self)
        if self.compute_with_cache:
            self._computed = value
        return value

    return wrapped


class Metric(nn.Module):
    """Base of kdcollapse's stateful metrics: the torchmetrics protocol (module docstring).

    Args:
        sync_on_compute: gather the states across processes in ``compute`` (default True).
        dist_sync_fn: replaces ``gather_all_tensors`` (``fn(tensor, group=...) -> list of tensors``).
        process_group: the group to sync over (default: the whole world).
        distributed_available_fn: whether to sync at all (default: a process group is initialised).
        compute_with_cache: ``compute`` returns its cached value until the next ``update`` or ``reset``.
    """

    is_differentiable: bool | None = None
    higher_is_better: bool | None = None
    full_state_update: bool | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "update" in cls.__dict__:
            cls.update = _counted_update(cls.__dict__["update"])
        if "compute" in cls.__dict__:
            cls.compute = _cached_compute(cls.__dict__["compute"])

    def __init__(self, **options: Any) -> None:
        super().__init__()
        unknown = sorted(set(options) - set(OPTIONS))
        if unknown:
            raise KdcollapseError(f"unknown metric option(s) {', '.join(unknown)}; valid: {', '.join(OPTIONS)}")
        self.sync_on_compute = bool(options.get("sync_on_compute", True))
        self.dist_sync_fn = options.get("dist_sync_fn")
        self.process_group = options.get("process_group")
        self.distributed_available_fn = options.get("distributed_available_fn") or distributed_available
        self.compute_with_cache = bool(options.get("compute_with_cache", True))
        self._defaults: dict[str, Tensor] = {}
        self._reductions: dict[str, str | Callable | None] = {}
        self._computed: Any = None
        self._update_count = 0
        self._cache: dict[str, Tensor] | None = None
        self._is_synced = False

    def add_state(self, name: str, default: Tensor, dist_reduce_fx: str | Callable | None = "sum",
                  persistent: bool = False) -> None:
        """Declare a tensor state ``name`` starting (and reset) at ``default``, reduced across processes by
        ``dist_reduce_fx``. States are attributes, not buffers: they stay out of ``state_dict`` (torchmetrics'
        default, ``persistent=False``; persistent states are not supported)."""
        if not isinstance(default, Tensor):
            raise KdcollapseError(f"state {name!r} needs a tensor default, got {type(default).__name__}")
        if not (dist_reduce_fx is None or callable(dist_reduce_fx) or dist_reduce_fx in (*_REDUCTIONS, "cat")):
            raise KdcollapseError(f"unknown dist_reduce_fx {dist_reduce_fx!r}; choose one of "
                                  f"{', '.join((*_REDUCTIONS, 'cat'))}, None or a function")
        if persistent:
            raise KdcollapseError(f"state {name!r}: persistent states are not supported")
        setattr(self, name, default)
        self._defaults[name] = deepcopy(default)
        self._reductions[name] = dist_reduce_fx

    def update(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError

    def compute(self) -> Any:
        raise NotImplementedError

    @property
    def update_count(self) -> int:
        return self._update_count

    @property
    def update_called(self) -> bool:
        return self._update_count > 0

    @property
    def metric_state(self) -> dict[str, Tensor]:
        """The current states by name."""
        return {name: getattr(self, name) for name in self._defaults}

    def reset(self) -> None:
        """Every state back to its default (a fresh copy on the state's device)."""
        for name, default in self._defaults.items():
            setattr(self, name, default.detach().clone().to(getattr(self, name).device))
        self._update_count, self._computed, self._cache, self._is_synced = 0, None, None, False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Add the batch to the states and return the metric of the batch alone (not synced)."""
        self.update(*args, **kwargs)
        kept = self.metric_state, self._update_count, self.sync_on_compute
        self.reset()
        self.sync_on_compute = False
        try:
            self.update(*args, **kwargs)
            value = self.compute()
        finally:
            for name, state in kept[0].items():
                setattr(self, name, state)
            self._update_count, self.sync_on_compute, self._computed = kept[1], kept[2], None
        return value

    def merge_state(self, incoming_state: dict[str, Tensor] | Metric) -> None:
        """Add another metric's states (or a ``metric_state`` dict) to these, state by state, by each state's
        reduction (``"mean"`` is refused: it needs the counts behind each mean)."""
        other = incoming_state.metric_state if isinstance(incoming_state, Metric) else incoming_state
        if not isinstance(other, dict):
            raise KdcollapseError(f"merge_state takes a metric or its metric_state, not {type(other).__name__}")
        missing = sorted(set(self._defaults) - set(other))
        if missing:
            raise KdcollapseError(f"cannot merge: the incoming state lacks {missing}")
        for name, reduce in self._reductions.items():
            mine, theirs = getattr(self, name), other[name].to(getattr(self, name).device)
            if reduce == "cat":
                setattr(self, name, torch.cat([mine, theirs]))
            elif reduce == "mean" or reduce is None:
                raise KdcollapseError(f"cannot merge state {name!r}: its reduction {reduce!r} is not a merge")
            else:
                fn = _REDUCTIONS[reduce] if isinstance(reduce, str) else reduce
                setattr(self, name, fn(torch.stack([mine, theirs])))
        self._computed = None

    def sync(self, dist_sync_fn: Callable | None = None, process_group: Any = None, should_sync: bool = True,
             distributed_available: Callable | None = None) -> None:
        """Replace every state by its reduction over the processes (kept for ``unsync``); nothing without a
        process group or with ``should_sync=False``."""
        if self._is_synced and should_sync:
            raise KdcollapseError("the metric is already synced; call unsync first")
        available = distributed_available or self.distributed_available_fn
        if not should_sync or not available():
            return
        gather = dist_sync_fn or gather_all_tensors
        group = process_group or self.process_group
        self._cache = self.metric_state
        for name, reduce in self._reductions.items():
            gathered = gather(getattr(self, name), group=group)
            if reduce == "cat":
                value = torch.cat(gathered)
            elif reduce is None:
                value = torch.stack(gathered)
            else:
                value = (_REDUCTIONS[reduce] if isinstance(reduce, str) else reduce)(torch.stack(gathered))
            setattr(self, name, value)
        self._is_synced = True

    def unsync(self, should_unsync: bool = True) -> None:
        """Restore the states ``sync`` replaced."""
        if not should_unsync:
            return
        if not self._is_synced or self._cache is None:
            raise KdcollapseError("the metric is not synced: nothing to unsync")
        for name, state in self._cache.items():
            setattr(self, name, state)
        self._cache, self._is_synced = None, False

    @contextlib.contextmanager
    def sync_context(self, dist_sync_fn: Callable | None = None, process_group: Any = None,
                     should_sync: bool = True, should_unsync: bool = True,
                     distributed_available: Callable | None = None) -> Iterator[None]:
        """The states synced inside the block, restored after it."""
        self.sync(dist_sync_fn, process_group, should_sync, distributed_available)
        try:
            yield
        finally:
            self.unsync(should_unsync=self._is_synced and should_unsync)

    def _apply(self, fn: Callable, exclude_state: Any = ()) -> Metric:
        """Move (``.to``, ``.cuda``) the states and their defaults with the module's buffers."""
        this = super()._apply(fn)
        for name in self._defaults:
            if name in exclude_state:
                continue
            self._defaults[name] = fn(self._defaults[name])
            setattr(this, name, fn(getattr(this, name)))
        if isinstance(self._computed, Tensor):
            self._computed = fn(self._computed)
        elif isinstance(self._computed, dict):
            self._computed = {k: fn(v) if isinstance(v, Tensor) else v for k, v in self._computed.items()}
        return this

    def set_dtype(self, dtype: torch.dtype) -> Metric:
        """Convert the floating-point states (and defaults) to ``dtype``: the one way to change them."""
        return self._apply(lambda t: t.to(dtype) if t.is_floating_point() else t)

    # torchmetrics keeps a metric's dtype through a model's .half() / .double(): only set_dtype changes it.
    def type(self, dst_type: Any) -> Metric:  # noqa: A003
        return self

    def half(self) -> Metric:
        return self

    def float(self) -> Metric:  # noqa: A003
        return self

    def double(self) -> Metric:
        return self

    def bfloat16(self) -> Metric:
        return self

    def clone(self) -> Metric:
        return deepcopy(self)
