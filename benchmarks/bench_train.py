"""Training throughput of the real trainer loop, and the share of a step spent in data + augmentation.

For each model and batch size, a `Trainer` is built on a CIFAR-shaped synthetic dataset (uint8
3x32x32, 100 classes, crop 4 + flip, i.e. the CIFAR-100 recipe's data path) and runs `--steps`
training steps through `Trainer.step`. The same loader is then iterated alone for the same batches.
Both are timed in one process, so the ratio is meaningful on a shared machine.

    PYTHONPATH=src python benchmarks/bench_train.py                     # CPU, resnet8x4 + resnet32x4
    PYTHONPATH=src python benchmarks/bench_train.py --device cuda --amp bf16 --channels-last
"""

from __future__ import annotations

import argparse
import itertools
import time

import torch

from _timing import machine  # benchmarks/_timing.py
from kdcollapse.config import load_config
from kdcollapse.data import TensorDataset, register_dataset
from kdcollapse.train import Trainer

N_IMAGES = 4096


@register_dataset("_bench_cifar", description="random CIFAR-100-shaped uint8 images (benchmark only)")
def _bench_cifar(root, split):
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    n = N_IMAGES if split == "train" else 256
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    labels = torch.arange(n) % 100
    return TensorDataset(images, labels, [str(i) for i in range(100)], (0.5071, 0.4865, 0.4409),
                         (0.2673, 0.2564, 0.2762), "_bench_cifar")


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def measure(model: str, batch: int, steps: int, args, tmp: str) -> dict:
    cfg = load_config(None, [
        "data.name=_bench_cifar", f"data.batch_size={batch}", "data.crop_padding=4", "data.flip=true",
        f"model.name={model}", "train.progress=false", f"train.device={args.device}", f"train.amp={args.amp}",
        f"train.channels_last={str(args.channels_last).lower()}", f"run_dir={tmp}/{model}_{batch}",
    ])
    trainer = Trainer(cfg, overwrite=True)
    device, loader = trainer.device, trainer.train_loader
    loader.set_epoch(0)
    batches = list(itertools.islice(iter(loader), steps + 2))  # warm-up steps are the first two
    trainer.method.train()
    for x, y in batches[:2]:
        trainer.step(x, y)
    sync(device)
    start = time.perf_counter()
    for x, y in batches[2:]:
        if args.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        trainer.step(x, y)
    sync(device)
    step_time = (time.perf_counter() - start) / steps
    # The loader alone, same batches (augmentation included), timed over several passes.
    start, passes = time.perf_counter(), 5
    for _ in range(passes):
        for _x, _y in itertools.islice(iter(loader), steps):
            pass
    sync(device)
    data_time = (time.perf_counter() - start) / (passes * steps)
    return {"model": model, "batch": batch, "images_per_s": batch / step_time, "step_ms": 1e3 * step_time,
            "data_ms": 1e3 * data_time, "data_share": data_time / (step_time + data_time)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="resnet8x4,resnet32x4")
    parser.add_argument("--batches", default="64,256")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--amp", default="off", choices=["off", "bf16", "fp16"])
    parser.add_argument("--channels-last", action="store_true")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    import tempfile

    print(f"# {machine(torch.device(args.device))}, amp {args.amp}, "
          f"channels_last {args.channels_last}, {args.steps} timed steps")
    print("| model | batch | images/s | step ms | data+aug ms | data share |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for batch in map(int, args.batches.split(",")):
                r = measure(model, batch, args.steps, args, tmp)
                print(f"| {r['model']} | {r['batch']} | {r['images_per_s']:.1f} | {r['step_ms']:.1f} | "
                      f"{r['data_ms']:.2f} | {100 * r['data_share']:.2f} % |", flush=True)


if __name__ == "__main__":
    main()
