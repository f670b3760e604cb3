"""Small datasets that need no files: the UCI digits (shipped with the package) and a Gaussian mixture."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch

from kdcollapse.data._dataset import Augment, TensorDataset, derive_seed, register_dataset
from kdcollapse.errors import DataError

DIGITS_SPLIT_SEED = 0


DIGITS_FILE = Path(__file__).with_name("digits.npz")  # licence and origin: digits.LICENSE.txt beside it


@register_dataset("digits", description="the UCI 8x8 grey digits (shipped with kdcollapse): 1797 images of 10 classes",
                  reads_files=False)
def digits(root: Path | None, split: str) -> TensorDataset:
    """The UCI optical digits, as uint8 ``(N, 1, 8, 8)`` images: the 1,797 images and labels of scikit-learn's
    ``load_digits()``, shipped in the package (``digits.npz``, BSD 3-Clause from scikit-learn, from UCI:
    ``digits.LICENSE.txt``), so the core install needs no scikit-learn.

    Pixel values 0..16 are scaled to 0..255 (``round(v * 255 / 16)``). The split is fixed, seeded and
    stratified: in every class a permutation drawn with ``torch.Generator().manual_seed(0)`` puts its
    first ``count // 5`` samples into ``test`` (355 images) and the rest into ``train`` (1442); each
    split keeps the original order. Mean and std are those of the train pixels.
    """
    with np.load(DIGITS_FILE, allow_pickle=False) as stored:
        pixels, target = stored["images"], stored["labels"]
    images = torch.from_numpy(pixels).double().mul(255 / 16).round().to(torch.uint8).unsqueeze(1)
    labels = torch.from_numpy(target).long()
    is_test = torch.zeros(len(labels), dtype=torch.bool)
    g = torch.Generator().manual_seed(DIGITS_SPLIT_SEED)
    for c in range(10):
        members = torch.nonzero(labels == c).flatten()
        members = members[torch.randperm(len(members), generator=g)]
        is_test[members[: len(members) // 5]] = True
    train_pixels = images[~is_test].float() / 255
    keep = is_test if split == "test" else ~is_test
    return TensorDataset(
        inputs=images[keep],
        labels=labels[keep],
        classes=[str(d) for d in range(10)],
        mean=(round(train_pixels.mean().item(), 4),),
        std=(round(train_pixels.std().item(), 4),),
        name="digits",
        default_augment=Augment(),
    )


@register_dataset("gaussian_mixture", description="synthetic: K isotropic Gaussian classes in D dimensions",
                  reads_files=False)
def gaussian_mixture(
    root: Path | None,
    split: str,
    num_classes: int = 10,
    dim: int = 32,
    n_per_class: int = 100,
    separation: float = 4.0,
    seed: int = 0,
) -> TensorDataset:
    """Float32 vectors ``x = mu_y + z``, ``z ~ N(0, I_dim)``, ``n_per_class`` of each class per split.

    The class means are ``separation / sqrt(2)`` times orthonormal directions when ``num_classes <=
    dim`` (every pair of means then lies exactly ``separation`` noise standard deviations apart) and
    times random unit directions otherwise. Means come from ``seed``; the train and test samples from
    two further streams derived from it, so both splits share the means and the whole set is a pure
    function of the arguments. Labels are sorted by class.
    """
    if num_classes < 2 or dim < 1 or n_per_class < 1 or not separation >= 0:
        raise DataError(
            "gaussian_mixture needs num_classes >= 2, dim >= 1, n_per_class >= 1, separation >= 0; got "
            f"{num_classes}, {dim}, {n_per_class}, {separation}"
        )
    g = torch.Generator().manual_seed(derive_seed(seed))
    directions = torch.randn(dim, num_classes, generator=g, dtype=torch.float64)
    if num_classes <= dim:
        directions = torch.linalg.qr(directions).Q
    else:
        directions = directions / directions.norm(dim=0, keepdim=True)
    means = (separation / math.sqrt(2) * directions.T).float()  # (K, D)
    g = torch.Generator().manual_seed(derive_seed(seed, 1 if split == "train" else 2))
    labels = torch.arange(num_classes).repeat_interleave(n_per_class)
    inputs = means[labels] + torch.randn(len(labels), dim, generator=g)
    return TensorDataset(
        inputs=inputs,
        labels=labels,
        classes=[f"class_{k}" for k in range(num_classes)],
        mean=(0.0,),
        std=(1.0,),
        name="gaussian_mixture",
    )
