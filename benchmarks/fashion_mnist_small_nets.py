"""Can the small nets learn Fashion-MNIST? Trains one registered model from scratch on CPU and prints
the test accuracy after every epoch: a check of the architecture that writes no file. The recorded
Fashion-MNIST result of the convnet, trained by ``kdcollapse train``, is results/fashion_mnist_teacher/README.md.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/fashion_mnist_small_nets.py --model convnet

Reads the IDX files directly (no dependency on kdcollapse.data) so that it checks only the architecture.
"""

from __future__ import annotations

import argparse
import gzip
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kdcollapse.models import count_parameters, create_model

ROOT = Path("/usr/share/datasets/fashion-mnist")
MEAN, STD = 0.2860, 0.3530  # Fashion-MNIST training-set pixel statistics in [0, 1] units

HP = {
    "epochs": 15,
    "batch_size": 128,
    "lr": 0.05,  # peak SGD learning rate per 128 examples, cosine-annealed to 0 per step
    "momentum": 0.9,  # Nesterov
    "weight_decay": 5e-4,
    "pad": 2,  # random-crop padding in pixels; plus random horizontal flips
}


def load(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    prefix = "train" if split == "train" else "t10k"
    with gzip.open(ROOT / f"{prefix}-images-idx3-ubyte.gz") as f:
        images = np.frombuffer(f.read(), np.uint8, offset=16).reshape(-1, 1, 28, 28)
    with gzip.open(ROOT / f"{prefix}-labels-idx1-ubyte.gz") as f:
        labels = np.frombuffer(f.read(), np.uint8, offset=8)
    x = (torch.from_numpy(images.copy()).float() / 255 - MEAN) / STD
    return x, torch.from_numpy(labels.astype(np.int64))


def augment(x: torch.Tensor, g: torch.Generator) -> torch.Tensor:
    """Per-example random crop of the zero-padded image (pad = HP['pad']) and random horizontal flip."""
    n, _, h, w = x.shape
    p = HP["pad"]
    padded = F.pad(x, (p, p, p, p), value=-MEAN / STD)  # pad with the value of a black pixel
    di = torch.randint(0, 2 * p + 1, (n,), generator=g)
    dj = torch.randint(0, 2 * p + 1, (n,), generator=g)
    rows = (di[:, None] + torch.arange(h))[:, :, None]
    cols = (dj[:, None] + torch.arange(w))[:, None, :]
    out = padded[torch.arange(n)[:, None, None], 0, rows, cols]
    flip = torch.rand(n, generator=g) < 0.5
    return torch.where(flip[:, None, None], out.flip(-1), out)[:, None]


@torch.no_grad()
def accuracy(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    correct = sum((model(xb).argmax(1) == yb).sum().item() for xb, yb in zip(x.split(1000), y.split(1000)))
    model.train()
    return correct / len(y)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="convnet")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    x_train, y_train = load("train")
    x_test, y_test = load("test")
    # channels_last: ~1.5x faster convolutions on CPU (oneDNN); the MLP flattens either layout the same.
    model = create_model(args.model, num_classes=10, in_channels=1).to(memory_format=torch.channels_last)
    steps = HP["epochs"] * (len(y_train) // HP["batch_size"])
    opt = torch.optim.SGD(model.parameters(), lr=HP["lr"], momentum=HP["momentum"], nesterov=True,
                          weight_decay=HP["weight_decay"])  # fmt: skip
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, steps)
    print(f"{args.model}: {count_parameters(model):,} parameters, {torch.get_num_threads()} thread(s)")
    start = time.perf_counter()
    for epoch in range(HP["epochs"]):
        perm = torch.randperm(len(y_train), generator=g)
        for idx in perm[: steps // HP["epochs"] * HP["batch_size"]].split(HP["batch_size"]):
            x = augment(x_train[idx], g).contiguous(memory_format=torch.channels_last)
            loss = F.cross_entropy(model(x), y_train[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
        acc = accuracy(model, x_test, y_test)
        elapsed = time.perf_counter() - start
        print(f"epoch {epoch + 1:2d}  loss {loss.item():.3f}  test acc {acc:.4f}  {elapsed:.0f}s", flush=True)


if __name__ == "__main__":
    main()
