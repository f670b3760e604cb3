"""Theorems 1-2 of the intra-class contrastive KD paper (§4.2) on synthetic embeddings: the constructions the
tests check (``tests/test_intra_class_theory.py``) and the numbers of results/intra_class/theorems/README.md.

    OMP_NUM_THREADS=1 python -m kdcollapse.experiments.intra_class_theory > results/intra_class/theorems/output.txt
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kdcollapse.losses import intra_class_contrastive_loss


def sphere_classes(num_classes: int, per_class: int, dim: int, spread: float, generator) -> tuple:
    """Unit embeddings: class centres on the sphere plus Gaussian noise of std ``spread``, renormalised."""
    centres = F.normalize(torch.randn(num_classes, dim, generator=generator, dtype=torch.float64), dim=1)
    labels = torch.arange(num_classes).repeat_interleave(per_class)
    noise = spread * torch.randn(len(labels), dim, generator=generator, dtype=torch.float64)
    return F.normalize(centres[labels] + noise, dim=1), labels


def tuplet_loss(anchor, positive, negatives) -> float:
    """The tuplet loss of one anchor with its positive against ``negatives`` (the paper's eq. 7 for one x)."""
    return intra_class_contrastive_loss(anchor[None], positive[None], negatives[None]).item()


def minimise_eq_9(weight: float, seed: int) -> tuple[float, float]:
    """Minimise L_Inter + λ·L_Intra (eq. 9) over a linear embedding of a 3-class Gaussian mixture, each
    point with two noisy views; every other-class sample is a negative of L_Inter, every other same-class
    sample one of L_Intra. Returns the minimiser's (L_Intra, L_Inter)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(3, 6, generator=g).repeat_interleave(12, 0) * 2 + torch.randn(36, 6, generator=g)
    y = torch.arange(3).repeat_interleave(12)
    embed = torch.nn.Linear(6, 8)
    torch.manual_seed(seed)
    torch.nn.init.normal_(embed.weight, std=0.3)
    optimizer = torch.optim.Adam(embed.parameters(), lr=0.05)
    same = (y[:, None] == y[None, :]) & ~torch.eye(36, dtype=torch.bool)
    other = y[:, None] != y[None, :]
    for _ in range(300):
        views = x[:, None] + 0.2 * torch.randn(36, 2, 6, generator=g)
        a, p = F.normalize(embed(views[:, 0]), dim=1), F.normalize(embed(views[:, 1]), dim=1)
        negatives = a[None].expand(36, 36, 8)
        l_inter = intra_class_contrastive_loss(a, p, negatives, other)
        l_intra = intra_class_contrastive_loss(a, p, negatives, same)
        optimizer.zero_grad()
        (l_inter + weight * l_intra).backward()
        optimizer.step()
    return l_intra.item(), l_inter.item()


def theorem_1(ratio: int, seed: int) -> list[tuple[int, float]]:
    """Relative error of ratio·e^{L_Intra − L_Inter} against d_Intra/d_Inter for one anchor, against m."""
    g = torch.Generator().manual_seed(seed)
    phi, labels = sphere_classes(6, 40_000, 8, spread=0.6, generator=g)
    anchor = phi[0]
    positive = F.normalize(anchor + 0.1 * torch.randn(8, generator=g, dtype=torch.float64), dim=0)
    same, other = phi[1:][labels[1:] == 0], phi[labels != 0]
    other = other[torch.randperm(len(other), generator=g)]  # negatives are drawn from all other classes
    target = (same @ anchor).exp().mean().item() / (other @ anchor).exp().mean().item()
    return [(m, ratio * math.exp(tuplet_loss(anchor, positive, same[:m])
                                 - tuplet_loss(anchor, positive, other[: ratio * m])) / target - 1)
            for m in (1, 2, 10, 100, 1000, 10_000, 30_000)]


def main() -> None:
    torch.set_num_threads(1)
    print("Theorem 1: relative error of K·exp(L_Intra − L_Inter) vs d_Intra/d_Inter (one anchor), n = K·m")
    for ratio in (2, 5):
        for seed in (0, 1, 2):
            print(f"K={ratio} seed={seed}: " + ", ".join(f"m={m}: {e:+.3f}" for m, e in theorem_1(ratio, seed)))
    print("Theorem 2: L_Intra/L_Inter at the (approximate) minimiser of L_Inter + λ·L_Intra")
    for seed in (0, 1, 2):
        cells = []
        for lam in (0.03, 0.1, 0.3, 1.0, 3.0, 10.0, 30.0):
            intra, inter = minimise_eq_9(lam, seed)
            cells.append(f"λ={lam:g}: {intra / inter:.3f} (L_Intra {intra:.3f}, L_Inter {inter:.3f})")
        print(f"seed={seed}: " + "; ".join(cells))


if __name__ == "__main__":
    main()
