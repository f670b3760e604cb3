"""A bounded, class-stratified uniform sample of a stream of rows (for t-SNE and nearest-class-mean)."""

from __future__ import annotations

import torch
from torch import Tensor

from kdcollapse.errors import KdcollapseError


class ClassReservoir:
    """Keeps a uniform random sample of at most ``per_class`` rows of every class from a stream.

    Every row gets a random key from a generator seeded with ``seed``; the sample of a class is its rows
    with the ``per_class`` smallest keys ("bottom-k" sampling): a uniform sample without replacement
    whatever the batching, and the whole class when it has at most ``per_class`` rows. Memory is bounded
    by about twice ``num_classes * per_class`` rows: offered rows whose key cannot make the cut are
    dropped at once, the rest are buffered and the buffer is cut back to the sample when it fills.
    Rows live on the CPU; reading ``labels``/``columns`` returns them sorted by class, then by key, so
    the first ``m`` rows of a class are themselves a uniform sample of size ``m``.

    >>> r = ClassReservoir(num_classes=2, per_class=3, seed=0)
    >>> r.update(torch.tensor([0, 1, 0, 0, 0]), features=torch.arange(5.0)[:, None])
    >>> r.labels.tolist(), r.count.tolist(), r.exact
    ([0, 0, 0, 1], [4, 1], False)
    """

    def __init__(self, num_classes: int, per_class: int, seed: int = 0) -> None:
        if not isinstance(per_class, int) or per_class < 1:
            raise KdcollapseError(f"the sample needs at least 1 row per class, got per_class={per_class!r}")
        self.num_classes, self.per_class = num_classes, per_class
        self.generator = torch.Generator().manual_seed(seed)
        self.count = torch.zeros(num_classes, dtype=torch.int64)  # rows offered per class
        self._threshold = torch.full((num_classes,), float("inf"))  # keys at or above it cannot enter
        self._parts: list[tuple[Tensor, Tensor, dict[str, Tensor]]] = []  # (keys, labels, columns)
        self._buffered = 0

    def update(self, labels: Tensor, **columns: Tensor) -> None:
        """Offer a batch: ``labels`` ``(B,)`` and named columns of ``B`` rows each."""
        labels = labels.detach().cpu()
        names = sorted(columns)
        if self._parts and names != sorted(self._parts[0][2]):
            raise KdcollapseError(f"columns {names} differ from the first batch's {sorted(self._parts[0][2])}")
        self.count += torch.bincount(labels, minlength=self.num_classes)
        keys = torch.rand(labels.shape[0], generator=self.generator)
        entering = (keys < self._threshold[labels]).nonzero().flatten()
        if entering.numel() == 0:
            return
        moved = {name: value.detach()[entering.to(value.device)].cpu() for name, value in columns.items()}
        self._parts.append((keys[entering], labels[entering], moved))
        self._buffered += entering.numel()
        if self._buffered > 2 * self.num_classes * self.per_class:
            self._compact()

    def _compact(self) -> None:
        if len(self._parts) <= 1 and self._buffered == 0:
            return
        keys = torch.cat([p[0] for p in self._parts])
        labels = torch.cat([p[1] for p in self._parts])
        order = keys.argsort()
        order = order[labels[order].argsort(stable=True)]  # by class, then by key
        rank = _rank_in_class(labels[order], self.num_classes)
        keep = order[rank < self.per_class]
        columns = {name: torch.cat([p[2][name] for p in self._parts])[keep] for name in self._parts[0][2]}
        self._parts = [(keys[keep], labels[keep], columns)]
        self._buffered = 0
        full = torch.bincount(labels[keep], minlength=self.num_classes) == self.per_class
        last = torch.full((self.num_classes,), float("inf")).scatter_reduce(
            0, labels[keep], keys[keep], reduce="amax", include_self=False
        )
        self._threshold = torch.where(full, last, torch.full_like(last, float("inf")))

    @property
    def labels(self) -> Tensor:
        """``(n,)`` labels of the sample, sorted by class."""
        self._compact()
        return self._parts[0][1] if self._parts else torch.empty(0, dtype=torch.int64)

    @property
    def columns(self) -> dict[str, Tensor]:
        """The sampled rows of every column, in the order of :attr:`labels`."""
        self._compact()
        return self._parts[0][2] if self._parts else {}

    @property
    def exact(self) -> bool:
        """Whether the sample holds every row offered (no class had more than ``per_class`` rows)."""
        return bool((self.count <= self.per_class).all())

    def first(self, per_class: int, classes: list[int] | None = None) -> Tensor:
        """Indices into the sample of at most ``per_class`` rows of each class in ``classes`` (None: all),
        still a uniform sample of each class."""
        labels = self.labels
        chosen = torch.ones_like(labels, dtype=torch.bool)
        if classes is not None:
            chosen = torch.isin(labels, torch.tensor(classes, dtype=torch.int64))
        return (chosen & (_rank_in_class(labels, self.num_classes) < per_class)).nonzero().flatten()


def _rank_in_class(sorted_labels: Tensor, num_classes: int) -> Tensor:
    """Position of each row within its class, for labels sorted by class: [0, 0, 1, 1, 1] -> [0, 1, 0, 1, 2]."""
    counts = torch.bincount(sorted_labels, minlength=num_classes)
    first = torch.cumsum(counts, 0) - counts
    return torch.arange(sorted_labels.numel()) - first[sorted_labels]
