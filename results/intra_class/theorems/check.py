"""Numbers for results/intra_class/theorems/README.md: Theorems 1-2 of the intra-class contrastive KD paper
on synthetic embeddings (the same constructions as tests/test_intra_class_theory.py, more points).

    OMP_NUM_THREADS=1 PYTHONPATH=src:tests python results/intra_class/theorems/check.py
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from test_intra_class_theory import minimise_eq_9, sphere_classes, tuplet_loss


def theorem_1(ratio: int, seed: int) -> list[tuple[int, float]]:
    """Relative error of ratio·e^{L_Intra − L_Inter} against d_Intra/d_Inter for one anchor, vs m."""
    g = torch.Generator().manual_seed(seed)
    phi, labels = sphere_classes(6, 40_000, 8, spread=0.6, generator=g)
    anchor = phi[0]
    positive = F.normalize(anchor + 0.1 * torch.randn(8, generator=g, dtype=torch.float64), dim=0)
    same, other = phi[1:][labels[1:] == 0], phi[labels != 0]
    other = other[torch.randperm(len(other), generator=g)]
    target = (same @ anchor).exp().mean().item() / (other @ anchor).exp().mean().item()
    out = []
    for m in (1, 2, 10, 100, 1000, 10_000, 30_000):
        predicted = ratio * math.exp(tuplet_loss(anchor, positive, same[:m])
                                     - tuplet_loss(anchor, positive, other[: ratio * m]))
        out.append((m, predicted / target - 1))
    return out


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
