"""The trainer's speed options on one KD step and one KD epoch, as ratios to today's fp32 default.

Part `step`: the real `Trainer.step` (student + teacher forward, KD loss, backward, SGD) of two pairs,
  resnet32x4 -> resnet8x4 on CIFAR-100-shaped random images (3x32x32, 100 classes) and
  convnet -> convnet_small on Fashion-MNIST (1x28x28, 10 classes), batch 64, with
  fp32 (the default) | bf16 | channels_last | stored teacher logits (teacher.cache=logits) | compile
  (with --compile) | the best combination. One trainer per option lives in one process; every round
  times `--steps` steps of each option in a shuffled order; the ratio is the option's median step time
  over the default's.
Part `epoch`: a whole training epoch (`Trainer.train_epoch`) of KD with stored teacher logits against a
  student-only (vanilla) epoch of the same student on the same images, interleaved the same way.

Teachers are randomly initialised (speed does not depend on their weights). The same script runs on
CUDA (`--device cuda`: the options then include fp16) and writes its device into the output.

    PYTHONPATH=src python benchmarks/bench_speed.py --threads 1 --rounds 5
    PYTHONPATH=src python benchmarks/bench_speed.py --device cuda --compile
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import tempfile
import time
from pathlib import Path

import torch

from _timing import interleave, machine
from kdcollapse.config import load_config
from kdcollapse.data import TensorDataset, register_dataset
from kdcollapse.models import create_model
from kdcollapse.runs import save_model
from kdcollapse.train import Trainer

PAIRS = {  # name: (dataset overrides, teacher, student)
    "resnet32x4->resnet8x4": (["data.name=_bench_cifar100"], "resnet32x4", "resnet8x4"),
    "convnet->convnet_small": (["data.name=fashion_mnist", "data.train_per_class=300", "data.test_per_class=10"],
                               "convnet", "convnet_small"),
    # K = 100 (1x28x56 pairs): studies/central_k100's pair, for its precision decision
    "fashion_mnist_pairs:convnet->convnet_small": (["data.name=fashion_mnist_pairs", "data.train_per_class=30",
                                                    "data.test_per_class=2"], "convnet", "convnet_small"),
    # always available offline: the precision-by-CPU-capability comparison (results/benchmarks/speed.md)
    "digits:convnet_small->convnet_small": (["data.name=digits"], "convnet_small", "convnet_small"),
}


@register_dataset("_bench_cifar100", description="random CIFAR-100-shaped uint8 images (benchmark only)")
def _bench_cifar100(root, split):
    g = torch.Generator().manual_seed(0 if split == "train" else 1)
    n = 1000 if split == "train" else 100
    images = torch.randint(0, 256, (n, 3, 32, 32), dtype=torch.uint8, generator=g)
    return TensorDataset(images, torch.arange(n) % 100, [str(i) for i in range(100)], (0.5071, 0.4865, 0.4409),
                         (0.2673, 0.2564, 0.2762), "_bench_cifar100")


def options(device: torch.device, with_compile: bool) -> dict[str, list[str]]:
    opts = {"fp32 (default)": [], "bf16": ["train.amp=bf16"], "channels_last": ["train.channels_last=true"],
            "stored teacher logits": ["teacher.cache=logits"]}
    if device.type == "cuda":
        opts["fp16"] = ["train.amp=fp16"]
    if with_compile:
        opts["compile"] = ["train.compile=true"]
    opts["bf16 + channels_last + stored logits"] = ["train.amp=bf16", "train.channels_last=true",
                                                    "teacher.cache=logits"]
    return opts


def teacher_file(tmp: Path, pair: str, teacher: str) -> Path:
    data, _, _ = PAIRS[pair]
    cfg = load_config(None, [*data, f"model.name={teacher}"])
    from kdcollapse.runs import run_dataset

    ds = run_dataset(cfg, "train")
    path = tmp / f"{teacher}.safetensors"
    model = create_model(teacher, ds.num_classes, in_channels=ds.in_channels)
    save_model(path, model, {"model": teacher, "num_classes": ds.num_classes, "in_channels": ds.in_channels})
    return path


def build(tmp: Path, pair: str, extra: list[str], device: str, method: str = "kd") -> Trainer:
    data, teacher, student = PAIRS[pair]
    teach = [f"teacher.model={teacher}", f"teacher.weights={tmp / (teacher + '.safetensors')}"] if method != "vanilla" \
        else []
    cfg = load_config(None, [*data, "data.batch_size=64", f"model.name={student}", f"method.name={method}", *teach,
                             "train.progress=false", f"train.device={device}", f"run_dir={tmp / str(time.time_ns())}",
                             *extra])
    with contextlib.redirect_stdout(io.StringIO()):
        return Trainer(cfg)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_steps(trainer: Trainer, batches: list, steps: int) -> float:
    """Seconds per step over ``steps`` steps (the batches' dataset indices select stored teacher rows)."""
    sync(trainer.device)
    start = time.perf_counter()
    for i, (x, y) in enumerate(batches[:steps]):
        if trainer.teacher is not None:
            trainer.teacher.select(trainer.train_loader.batch_index(i))
        trainer.step(trainer.to_layout(x), y)
    sync(trainer.device)
    return (time.perf_counter() - start) / steps


def step_part(tmp: Path, args, device: torch.device) -> None:
    print(f"\n## KD step, batch 64, {args.steps} steps per round, {args.rounds} interleaved rounds\n")
    print("| pair | option | step ms | ratio to fp32 default |\n|---|---|---|---|")
    for pair in args.pairs.split(","):
        teacher_file(tmp, pair, PAIRS[pair][1])
        timers = {}
        for name, extra in options(device, args.compile).items():
            trainer = build(tmp, pair, extra, args.device)
            trainer.train_loader.set_epoch(0)
            trainer.method.train()
            batches = list(itertools.islice(iter(trainer.train_loader), args.steps))
            time_steps(trainer, batches, min(2, args.steps))  # warm-up (compiles, when compiling)
            timers[name] = lambda t=trainer, b=batches: time_steps(t, b, args.steps)
        medians = interleave(timers, args.rounds)
        base = medians["fp32 (default)"]
        for name, seconds in medians.items():
            print(f"| {pair} | {name} | {1e3 * seconds:.1f} | {seconds / base:.2f} |", flush=True)


def epoch_part(tmp: Path, args, device: torch.device) -> None:
    print(f"\n## One training epoch: KD from stored teacher logits vs student only, {args.rounds} rounds\n")
    print("A second, identical student-only trainer is timed as a control: its ratio is the noise floor.\n")
    print("| pair | images | student-only epoch s | KD (stored logits) epoch s | ratio | control ratio |\n"
          "|---|---|---|---|---|---|")
    for pair in args.pairs.split(","):
        teacher_file(tmp, pair, PAIRS[pair][1])
        runs = {"vanilla": build(tmp, pair, [], args.device, method="vanilla"),
                "control": build(tmp, pair, [], args.device, method="vanilla"),
                "kd": build(tmp, pair, ["teacher.cache=logits"], args.device)}

        def epoch(trainer):
            start = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                trainer.train_epoch(0)
            sync(trainer.device)
            return time.perf_counter() - start

        for trainer in runs.values():
            epoch(trainer)  # warm-up: the first epoch creates the kernels' primitives
        medians = interleave({k: (lambda t=t: epoch(t)) for k, t in runs.items()}, args.rounds)
        n = runs["kd"].train_loader.num_samples
        print(f"| {pair} | {n} | {medians['vanilla']:.2f} | {medians['kd']:.2f} | "
              f"{medians['kd'] / medians['vanilla']:.2f} | {medians['control'] / medians['vanilla']:.2f} |",
              flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--part", choices=["step", "epoch", "both"], default="both")
    parser.add_argument("--pairs", default=",".join(PAIRS))
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--compile", action="store_true", help="also time train.compile=true (slow to compile)")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"# {machine(device)}")
    with tempfile.TemporaryDirectory() as tmp:
        if args.part in ("step", "both"):
            step_part(Path(tmp), args, device)
        if args.part in ("epoch", "both"):
            epoch_part(Path(tmp), args, device)


if __name__ == "__main__":
    main()
