"""The loader: seeded shuffling on the device, DDP shards, batched augmentation, normalisation.

Each epoch has a plan drawn from one generator seeded with ``derive_seed(seed, epoch)``: a permutation
of the dataset and, for every position in it, a crop offset and a flip bit (and, for folder datasets, a
seed for the worker's random-resized crop). Rank ``r`` of ``world_size`` takes positions ``r, r +
world_size, ...`` of the plan, so the shards are disjoint, the same size in training (the last
``n % world_size`` positions are left out, a different set each epoch) and cover everything in
evaluation. A sample's augmentation depends only on its position in the epoch's plan, so batches are a
pure function of ``(seed, epoch, rank, world_size)`` on a given device type.

With ``views = V > 1`` (contrastive methods) each sample is augmented V times independently: the plan
draws the first view's offsets and flips exactly as for one view, then V - 1 further sets from the
same generator, and ``x`` has shape ``(B, V, C, H, W)``. The first view is therefore the very batch a
single-view loader yields, and the single-view path does no extra work. With ``strong_views`` the further
views are also strongly augmented (RandAugment with two operations and Cutout, as MLKD's official code;
``data/_randaugment.py``), from numbers the plan draws after all of the above.
"""

from __future__ import annotations

import os
import weakref
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kdcollapse.data._dataset import Augment, TensorDataset, derive_seed
from kdcollapse.data._folder import FolderDataset
from kdcollapse.data._randaugment import draw_rand_augment, rand_augment_batch
from kdcollapse.errors import DataError, KdcollapseError


def augment_batch(
    x: torch.Tensor, offsets: torch.Tensor | None, flips: torch.Tensor | None, padding: int
) -> torch.Tensor:
    """Random crop with zero padding and horizontal flip of a batch, as one gather.

    ``x``: ``(B, C, H, W)`` (any dtype); ``offsets``: int64 ``(B, 2)`` in ``[0, 2 * padding]``, the
    top-left corner of each crop in the padded image; ``flips``: bool ``(B,)``. Output pixel ``(i, j)``
    of sample ``b`` is ``padded[b, :, oy + i, ox + j']`` with ``j' = W - 1 - j`` if flipped, else ``j``.
    """
    if offsets is None and flips is None:
        return x
    batch, channels, height, width = x.shape
    if padding:
        x = F.pad(x, (padding, padding, padding, padding))
    padded_w = width + 2 * padding
    cols = torch.arange(width, device=x.device).expand(batch, width)
    if flips is not None:
        cols = torch.where(flips[:, None], width - 1 - cols, cols)
    rows = torch.arange(height, device=x.device).expand(batch, height)
    if offsets is not None:
        rows, cols = rows + offsets[:, :1], cols + offsets[:, 1:]
    index = (rows[:, :, None] * padded_w + cols[:, None, :]).reshape(batch, 1, height * width)
    out = x.reshape(batch, channels, -1).gather(2, index.expand(batch, channels, -1))
    return out.reshape(batch, channels, height, width)


class Loader:
    """Yields ``(x, y)`` batches on ``device``: ``x`` float32 normalised, ``y`` int64 (see ``make_loader``).

    ``len(loader)`` is the number of batches of this rank; ``num_samples`` the samples it sees per epoch.
    """

    def __init__(
        self, dataset: TensorDataset | FolderDataset, batch_size: int, *, train: bool, device: torch.device,
        seed: int, augment: Augment, drop_last: bool, rank: int, world_size: int, views: int = 1,
        strong_views: bool = False,
    ):  # fmt: skip
        self.dataset, self.batch_size, self.train, self.device = dataset, batch_size, train, device
        self.seed, self.augment, self.drop_last = seed, augment, drop_last
        self.rank, self.world_size, self.views, self.strong_views = rank, world_size, views, strong_views
        self.epoch = 0
        self._current: dict[str, torch.Tensor] = {}  # the plan of the epoch being iterated
        n = len(dataset)
        self.num_samples = n // world_size if train else len(range(rank, n, world_size))
        channels = dataset.in_channels if len(dataset.mean) > 1 else 1
        shape = (1, channels, 1, 1) if len(dataset.input_shape) == 3 else (1, channels)
        std = torch.tensor(dataset.std, dtype=torch.float32, device=device).view(shape)
        mean = torch.tensor(dataset.mean, dtype=torch.float32, device=device).view(shape)
        # x = u * scale - shift == (u / 255 - mean) / std for uint8 images, (u - mean) / std for float inputs
        self._scale = 1 / (std * dataset.full_scale)
        self._shift = mean / std

    def set_epoch(self, epoch: int) -> None:
        """Select the epoch whose plan the next iteration follows (training order and augmentation)."""
        self.epoch = epoch

    def __len__(self) -> int:
        whole, rest = divmod(self.num_samples, self.batch_size)
        return whole + (rest > 0 and not self.drop_last)

    def batch_index(self, b: int) -> torch.Tensor:
        """Dataset indices of batch ``b`` of the epoch being iterated (valid once it was yielded)."""
        return self._current["index"][b * self.batch_size:(b + 1) * self.batch_size]

    def _plan(self, device: torch.device, extra_seeds: bool = False) -> dict[str, torch.Tensor]:
        """This rank's share of the epoch plan: ``index`` and, if used, ``offsets``, ``flips``, ``seeds``,
        and for ``views > 1`` the further views' ``extra_offsets`` ``(n, V - 1, 2)``, ``extra_flips``."""
        n = len(self.dataset)
        if not self.train:
            return {"index": torch.arange(self.rank, n, self.world_size, device=device)}
        g = torch.Generator(device=device).manual_seed(derive_seed(self.seed, self.epoch))
        plan = {"index": torch.randperm(n, generator=g, device=device)}
        plan |= self._draw_augmentation(g, (n,), device, "")
        if extra_seeds:
            plan["seeds"] = torch.randint(0, 2**62, (n,), generator=g, device=device)
        if self.views > 1:  # drawn after everything a single view uses, which therefore stays as it was
            plan |= self._draw_augmentation(g, (n, self.views - 1), device, "extra_")
            if self.strong_views:
                plan |= {"strong_" + k: v for k, v in draw_rand_augment(g, (n, self.views - 1), device).items()}
        mine = slice(self.rank, self.num_samples * self.world_size, self.world_size)
        return {k: v[mine] for k, v in plan.items()}

    def _draw_augmentation(self, g: torch.Generator, shape: tuple[int, ...], device: torch.device,
                           prefix: str) -> dict[str, torch.Tensor]:
        """Crop offsets ``(*shape, 2)`` and flip bits ``shape`` (those the augmentation uses)."""
        drawn = {}
        if self.augment.crop_padding:
            high = 2 * self.augment.crop_padding + 1
            drawn[prefix + "offsets"] = torch.randint(0, high, (*shape, 2), generator=g, device=device)
        if self.augment.flip:
            drawn[prefix + "flips"] = torch.randint(0, 2, shape, generator=g, device=device).bool()
        return drawn

    def _batch_slices(self) -> Iterator[slice]:
        for b in range(len(self)):
            yield slice(b * self.batch_size, (b + 1) * self.batch_size)

    def _finish(self, x: torch.Tensor, plan: dict[str, torch.Tensor], part: slice) -> torch.Tensor:
        if x.ndim == 4:
            views = [self._augment(x, plan, part, None)]
            views += [self._augment(x, plan, part, v) for v in range(self.views - 1)]
            x = views[0] if self.views == 1 else torch.stack(views, dim=1)  # (B, V, C, H, W)
        return x.float().mul_(self._scale).sub_(self._shift)

    def _augment(
        self, x: torch.Tensor, plan: dict[str, torch.Tensor], part: slice, extra: int | None
    ) -> torch.Tensor:
        """The first view (``extra=None``) or further view ``extra`` of batch ``x`` at plan positions ``part``."""
        prefix, index = ("", part) if extra is None else ("extra_", (part, extra))
        offsets, flips = plan.get(prefix + "offsets"), plan.get(prefix + "flips")
        x = augment_batch(
            x, None if offsets is None else offsets[index].to(x.device),
            None if flips is None else flips[index].to(x.device), self.augment.crop_padding,
        )  # fmt: skip
        if extra is None or not self.strong_views:
            return x
        strong = [plan["strong_" + k][index].to(x.device) for k in ("ops", "levels", "cutout")]
        return rand_augment_batch(x, *strong, full_scale=self.dataset.full_scale)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        raise NotImplementedError


class TensorLoader(Loader):
    """A :class:`Loader` over a :class:`TensorDataset` kept whole on the device; gathers need no workers."""

    def __init__(self, dataset: TensorDataset, batch_size: int, **kwargs):
        super().__init__(dataset, batch_size, **kwargs)
        self._inputs = dataset.inputs.to(self.device)
        self._labels = dataset.labels.to(self.device)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._current = plan = self._plan(self.device)
        for part in self._batch_slices():
            index = plan["index"][part]
            yield self._finish(self._inputs.index_select(0, index), plan, part), self._labels[index]


class FolderLoader(Loader):
    """A :class:`Loader` whose images are decoded by ``num_workers`` worker processes."""

    def __init__(self, dataset: FolderDataset, batch_size: int, *, num_workers: int, **kwargs):
        super().__init__(dataset, batch_size, **kwargs)
        self._loader = torch.utils.data.DataLoader(
            _Decoded(dataset, self.train),
            batch_sampler=_PlanBatches(weakref.ref(self)),  # weak: the DataLoader must not keep this alive
            num_workers=num_workers,
            collate_fn=_as_batch,
            pin_memory=self.device.type == "cuda",
            persistent_workers=num_workers > 0,
        )
        # Its workers are stopped when this loader is freed, while the DataLoader's queues are intact: left to
        # the garbage collector, the DataLoader's queues can be finalized before its iterator, whose shutdown
        # then waits out a 5 s timeout per worker (at whatever later allocation triggers the collection).
        weakref.finalize(self, _stop_workers, self._loader)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        self._current = plan = self._plan(torch.device("cpu"), extra_seeds=True)
        for part, batch in zip(self._batch_slices(), self._loader):
            if isinstance(batch, DecodeFailure):
                raise DataError(batch.message)
            x, y = batch
            x = x.to(self.device, non_blocking=True)
            yield self._finish(x, plan, part), y.to(self.device, non_blocking=True)


class DecodeFailure(NamedTuple):
    """What a worker returns instead of a batch when an image cannot be decoded: the one-line error.
    (An exception raised in a worker reaches the main process wrapped in the worker's traceback.)"""

    message: str


class _Decoded(torch.utils.data.Dataset):
    """Decodes batches of ``(index, seed)`` items in a worker process."""

    def __init__(self, dataset: FolderDataset, train: bool):
        self.dataset, self.train = dataset, train

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, items: list[tuple[int, int]]) -> tuple[torch.Tensor, torch.Tensor] | DecodeFailure:
        try:
            images = [self.dataset.decode(index, self.train, seed) for index, seed in items]
        except KdcollapseError as err:
            return DecodeFailure(str(err))
        return torch.stack(images), torch.tensor([self.dataset.samples[i][1] for i, _ in items], dtype=torch.int64)


def _stop_workers(loader: torch.utils.data.DataLoader) -> None:
    """Shut down the worker processes of ``loader``'s persistent iterator, if it started one."""
    iterator = getattr(loader, "_iterator", None)
    shutdown = getattr(iterator, "_shutdown_workers", None)
    if shutdown is not None:
        shutdown()
    loader._iterator = None


def _as_batch(batch):
    """The collate function: ``_Decoded.__getitems__`` already returns whole batches."""
    return batch


class _PlanBatches:
    """The batch sampler of a :class:`FolderLoader`: lists of ``(index, seed)`` from the current plan."""

    def __init__(self, loader: weakref.ref):
        self._loader = loader

    @property
    def loader(self) -> FolderLoader:
        return self._loader()

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[list[tuple[int, int]]]:
        plan = self.loader._current
        index = plan["index"].tolist()
        seeds = plan["seeds"].tolist() if "seeds" in plan else [0] * len(index)
        for part in self.loader._batch_slices():
            yield list(zip(index[part], seeds[part]))


def make_loader(
    dataset: TensorDataset | FolderDataset,
    batch_size: int,
    *,
    train: bool,
    device: str | torch.device,
    seed: int,
    augment: Augment | None = None,
    drop_last: bool | None = None,
    rank: int = 0,
    world_size: int = 1,
    num_workers: int | None = None,
    views: int = 1,
    strong_views: bool = False,
) -> Loader:
    """Batches of ``dataset`` on ``device`` for one rank; call ``set_epoch(epoch)`` before each epoch.

    ``train=True``: shuffled and augmented from ``derive_seed(seed, epoch)`` (``augment=None`` uses
    ``dataset.default_augment``; pass ``Augment()`` for none); ``train=False``: in order, unaugmented,
    every sample kept. ``drop_last`` (default ``False``) drops an incomplete last training batch. With
    ``world_size > 1`` each rank gets a disjoint shard of the same permutation. Folder datasets decode in
    ``num_workers`` processes (default ``min(8, cpu count)``); tensor datasets use none. ``views = V > 1``
    (training only) yields ``x`` of shape ``(B, V, C, H, W)``: V independently augmented views of each
    image, the first of which is the single-view batch; ``strong_views`` adds RandAugment(2) + Cutout to
    the views after the first (MLKD's strong augmentation).
    """
    device = torch.device(device)
    if not isinstance(batch_size, int) or batch_size < 1:
        raise DataError(f"batch_size must be a positive int, got {batch_size!r}")
    if not (isinstance(world_size, int) and isinstance(rank, int) and 0 <= rank < world_size):
        raise DataError(f"need 0 <= rank < world_size, got rank={rank!r}, world_size={world_size!r}")
    if drop_last and not train:
        raise DataError("evaluation loaders keep every sample; drop_last=True needs train=True")
    augment = dataset.default_augment if augment is None else augment
    if not isinstance(augment, Augment):
        raise DataError(f"augment must be an Augment or None, got {augment!r}")
    if train and augment.active and len(dataset.input_shape) != 3:
        raise DataError(f"{dataset.name}: crop/flip augmentation needs images, the inputs are vectors")
    if not (isinstance(views, int) and views >= 1):
        raise DataError(f"views must be an int >= 1, got {views!r}")
    if views > 1 and not (train and augment.active):
        raise DataError(
            f"views={views} asks for independently augmented views, but this loader does not augment "
            "(it needs train=True and an active augmentation: crop_padding > 0 or flip=True)"
        )
    if strong_views and views < 2:
        raise DataError("strong_views augments the views after the first; it needs views >= 2")
    if views > 1 and getattr(dataset, "random_resized_crop", False):
        raise DataError(
            f"{dataset.name}: views > 1 is not supported with random-resized crops, which the decoding "
            "workers draw once per image; use a dataset without random_resized_crop"
        )
    if train and len(dataset) < world_size:
        raise DataError(f"{dataset.name}: {len(dataset)} samples cannot be split over {world_size} ranks")
    kwargs = dict(
        train=train, device=device, seed=seed, augment=augment if train else Augment(),
        drop_last=bool(drop_last), rank=rank, world_size=world_size, views=views, strong_views=strong_views,
    )  # fmt: skip
    derive_seed(seed)  # validates the seed now rather than at the first iteration
    if isinstance(dataset, FolderDataset):
        workers = min(8, os.cpu_count() or 1) if num_workers is None else num_workers
        return FolderLoader(dataset, batch_size, num_workers=workers, **kwargs)
    return TensorLoader(dataset, batch_size, **kwargs)
