"""Cost of the training loader (gather + random crop/flip + normalise) per batch of 32x32x3 images.

Prints ms/batch for batch sizes 64 and 256, next to two baselines measured in the same process: a
per-sample Python loop doing the same augmentation, and (when the model registry has it) one SGD
step of resnet8x4 at the same batch size, whose ratio is the share of a step spent on data.

    PYTHONPATH=src python benchmarks/bench_data.py [--threads 1] [--device cpu] [--repeats 50]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from kdcollapse.data import Augment, TensorDataset, make_loader


def per_sample_loop(x: torch.Tensor, padding: int, g: torch.Generator) -> torch.Tensor:
    """The baseline: pad, crop and flip one image at a time (what a per-sample transform does)."""
    out = torch.empty_like(x)
    for b in range(len(x)):
        img = F.pad(x[b], (padding,) * 4)
        oy, ox = torch.randint(0, 2 * padding + 1, (2,), generator=g).tolist()
        img = img[:, oy : oy + x.shape[2], ox : ox + x.shape[3]]
        out[b] = img.flip(-1) if torch.rand(1, generator=g).item() < 0.5 else img
    return out


def timed(fn, repeats: int, sync) -> float:
    fn()  # warm-up
    sync()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    sync()
    return (time.perf_counter() - start) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--samples", type=int, default=50000, help="dataset size (CIFAR: 50000)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    g = torch.Generator().manual_seed(0)
    inputs = torch.randint(0, 256, (args.samples, 3, 32, 32), generator=g, dtype=torch.uint8)
    ds = TensorDataset(inputs, torch.arange(args.samples) % 100, [str(i) for i in range(100)],
                       (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), "bench")  # fmt: skip
    try:
        from kdcollapse.models import create_model

        model = create_model("resnet8x4", num_classes=100).to(device)
    except Exception as err:  # the model registry may not have it in this checkout
        model = None
        print(f"(no resnet8x4 step baseline: {type(err).__name__}: {err})")
    print(f"device {device}, {args.threads} thread(s), {args.repeats} repeats, "
          f"dataset {tuple(inputs.shape)} uint8")
    for batch in (64, 256):
        loader = make_loader(ds, batch, train=True, device=device, seed=0, augment=Augment(4, True))
        iterator = iter(loader)
        loader_ms = timed(lambda: next(iterator), args.repeats, sync)
        x = inputs[:batch]
        loop_ms = timed(lambda: per_sample_loop(x, 4, g), max(3, args.repeats // 10), sync)
        line = (f"batch {batch:>3}: loader {loader_ms:7.3f} ms/batch | "
                f"per-sample loop {loop_ms:7.2f} ms (x{loop_ms / loader_ms:.0f})")
        if model is not None:
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            xb, yb = next(iter(loader))

            def step():
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(xb), yb).backward()
                opt.step()

            step_ms = timed(step, max(3, args.repeats // 10), sync)
            share = loader_ms / (loader_ms + step_ms)
            line += f" | resnet8x4 step {step_ms:8.1f} ms -> data share {100 * share:.2f} %"
        print(line)


if __name__ == "__main__":
    main()
