"""``fashion_mnist_pairs``: a 100-class image task built from the Fashion-MNIST files alone.

An image is two Fashion-MNIST images side by side (uint8 ``(1, 28, 56)``); its class is
``10·left + right``, named ``"<left>|<right>"`` (e.g. ``"T-shirt/top|Trouser"``), and its superclass
is the left item. Each split pairs images of the matching Fashion-MNIST split only (test pairs from
test images), ``PAIRS_PER_CLASS`` pairs per class: 600 (60,000 in all) and 100 (10,000).

How the pairs are drawn, with one torch CPU generator seeded with ``PAIRS_SEED`` (fixed, independent
of the run's seed, so every run sees the same dataset): the pairs of class (a, b) are numbered
j = 0..n−1; the left image of pair (a, b, j) is the (b·n + j)-th image of class a in a random
permutation of the split, the right image the (a·n + j)-th image of class b in a second permutation
(indices wrap around a class with fewer images). In Fashion-MNIST every class has exactly 10·n
images (6,000 train, 1,000 test), so every image appears exactly once on the left and once on the
right: the pixel statistics are Fashion-MNIST's, and so are mean and std.
"""

from __future__ import annotations

from pathlib import Path

import torch

from kdcollapse.data._dataset import Augment, TensorDataset, register_dataset
from kdcollapse.data._idx import _MARKERS, FASHION_MNIST_CLASSES, load_idx_split
from kdcollapse.errors import DataError

PAIRS_SEED = 20170825  # Fashion-MNIST's release date; the same pairs in every run
PAIRS_PER_CLASS = {"train": 600, "test": 100}
FMNIST_MEAN, FMNIST_STD = 0.2860, 0.3530


def pair_images(
    images: torch.Tensor, labels: torch.Tensor, num_items: int, n_per_class: int, seed: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(inputs, pair_labels)``: ``n_per_class`` side-by-side pairs of every (left, right) class pair.

    ``images``: uint8 ``(N, C, H, W)``; ``labels``: int64 ``(N,)`` in ``[0, num_items)``. Returns
    ``(num_items² · n, C, H, 2W)`` images, class-major, with labels ``num_items·left + right``.
    Vectorised: two permutations and two gathers, no loop over images (see the module docstring).
    """
    counts = torch.bincount(labels, minlength=num_items)
    if int(counts.min()) == 0:
        raise DataError(f"cannot pair images: class {int(counts.argmin())} has no image")
    pair = torch.arange(num_items * num_items).repeat_interleave(n_per_class)
    j = torch.arange(len(pair)) % n_per_class
    left, right = pair // num_items, pair % num_items
    g = torch.Generator().manual_seed(seed)
    left_src = _nth_of_class(labels, counts, left, right * n_per_class + j, g)
    right_src = _nth_of_class(labels, counts, right, left * n_per_class + j, g)
    return torch.cat([images[left_src], images[right_src]], dim=3), pair


def _nth_of_class(
    labels: torch.Tensor, counts: torch.Tensor, cls: torch.Tensor, rank: torch.Tensor, g: torch.Generator
) -> torch.Tensor:
    """Index of the ``rank[i]``-th image (modulo the class size) of class ``cls[i]`` in a random permutation."""
    order = torch.randperm(len(labels), generator=g)
    by_class = order[torch.sort(labels[order], stable=True).indices]  # random order inside each class
    starts = torch.cumsum(counts, 0) - counts
    return by_class[starts[cls] + rank % counts[cls]]


@register_dataset(
    "fashion_mnist_pairs",
    description="Fashion-MNIST pairs side by side: 1x28x56 grey images of 100 classes (60k train / 10k test)",
    markers=_MARKERS,
    files_of="fashion_mnist",
    get="It is built from Fashion-MNIST's files: `kdcollapse data download fashion_mnist`, or point data.root "
        "at a folder holding them.",
)
def fashion_mnist_pairs(root: Path, split: str) -> TensorDataset:
    """Two Fashion-MNIST images side by side, class ``10·left + right``; normalised as Fashion-MNIST.

    Do not train with ``flip``: mirroring swaps the two items, i.e. changes the class.
    """
    source = load_idx_split(root, split, "fashion_mnist", FASHION_MNIST_CLASSES, FMNIST_MEAN, FMNIST_STD)
    num_items = len(FASHION_MNIST_CLASSES)
    inputs, labels = pair_images(source.inputs, source.labels, num_items, PAIRS_PER_CLASS[split], PAIRS_SEED)
    return TensorDataset(
        inputs=inputs,
        labels=labels,
        classes=[f"{a}|{b}" for a in FASHION_MNIST_CLASSES for b in FASHION_MNIST_CLASSES],
        mean=(FMNIST_MEAN,),
        std=(FMNIST_STD,),
        name="fashion_mnist_pairs",
        default_augment=Augment(),
        superclasses=list(FASHION_MNIST_CLASSES),
        superclass=[c // num_items for c in range(num_items * num_items)],
    )
