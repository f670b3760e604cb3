"""``train.compile``: what compiling costs, what each step saves, the break-even, and the evaluation.

For each model and memory layout, two real trainers (``train.compile`` true and false, everything else equal)
in one process:

* compile cost (cold: inductor's on-disk caches are disabled): the first two training steps of the compiled trainer minus two eager steps;
* step time: the median over interleaved rounds of ``--steps`` steps of each trainer;
* break-even: compile cost / (eager step − compiled step), in steps (and in epochs of ``--epoch-images``);
* evaluation: the first ``Trainer.evaluate()`` of the compiled trainer (which runs the compiled student
  eagerly, ``torch.compiler.set_stance("force_eager")``) against the same call compiled (``default`` stance:
  a second graph for eval mode is compiled first).

    PYTHONPATH=src python benchmarks/bench_compile.py --threads 1
    PYTHONPATH=src python benchmarks/bench_compile.py --device cuda
"""

from __future__ import annotations

import argparse
import contextlib
import io
import itertools
import os
import random
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")  # a cold compile, as a user's first run has
import torch  # noqa: E402

from _timing import machine
import bench_speed  # noqa: F401  (registers its random CIFAR-100-shaped dataset, _bench_cifar100)
from kdcollapse.config import load_config
from kdcollapse.train import Trainer

MODELS = {"convnet_small": ["data.name=fashion_mnist", "data.train_per_class=20", "data.test_per_class=5"],
          "resnet8x4": ["data.name=_bench_cifar100"]}  # 1,000 training and 100 test images


def build(tmp: Path, model: str, compile_: bool, channels_last: bool, device: str) -> Trainer:
    cfg = load_config(None, [*MODELS[model], "data.batch_size=64", "data.eval_batch_size=256", f"model.name={model}",
                             f"train.compile={str(compile_).lower()}", f"train.channels_last={str(channels_last).lower()}",
                             "train.progress=false", f"train.device={device}",
                             f"run_dir={tmp / f'{model}_{compile_}_{channels_last}'}"])
    with contextlib.redirect_stdout(io.StringIO()):
        trainer = Trainer(cfg)
    trainer.train_loader.set_epoch(0)
    trainer.method.train()
    return trainer


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def steps(trainer: Trainer, batches: list):
    def run():
        for x, y in batches:
            trainer.step(trainer.to_layout(x), y)
        sync(trainer.device)
    return run


def bench(tmp: Path, model: str, channels_last: bool, args) -> str:
    torch._dynamo.reset()  # every case compiles from scratch (dynamo counts recompiles per code object)
    trainers = {c: build(tmp, model, c, channels_last, args.device) for c in (False, True)}
    batches = {c: list(itertools.islice(iter(t.train_loader), args.steps)) for c, t in trainers.items()}
    first = {c: timed(steps(t, batches[c][:2])) for c, t in trainers.items()}  # compiles the training graph
    rounds: dict[bool, list[float]] = {False: [], True: []}
    rng = random.Random(0)
    for _ in range(args.rounds):
        for c in rng.sample([False, True], 2):
            rounds[c].append(timed(steps(trainers[c], batches[c])) / len(batches[c]))
    eager, compiled = (statistics.median(rounds[c]) for c in (False, True))
    cost = first[True] - 2 * eager
    saved = eager - compiled
    evaluate_eager = timed(trainers[True].evaluate)  # the trainer's way: the compiled student run eagerly
    with torch.compiler.set_stance("default"):
        trainers[True].cfg.train.compile = False  # so that evaluate does not switch to eager
        evaluate_compiled = timed(trainers[True].evaluate)
    per_epoch = args.epoch_images / 64
    even = f"{cost / saved:.0f} steps ({cost / saved / per_epoch:.2f} epochs)" if saved > 0 else "never"
    layout = "channels_last" if channels_last else "contiguous"
    return (f"| {model} | {layout} | {cost:.1f} | {1e3 * eager:.1f} | {1e3 * compiled:.1f} | {compiled / eager:.2f} | {even} | "
            f"{evaluate_eager:.2f} | {evaluate_compiled:.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epoch-images", type=int, default=60000)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    print(f"# train.compile: cost, break-even, evaluation — {machine(device)}\n")
    print(f"batch 64, {args.steps} steps x {args.rounds} interleaved rounds; break-even epochs of "
          f"{args.epoch_images} images\n")
    print("| model | layout | compile s | eager step ms | compiled step ms | ratio | break-even | first eval, eager s | "
          "first eval, compiled s |\n|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for model in args.models.split(","):
            for channels_last in (True, False):
                print(bench(Path(tmp), model, channels_last, args), flush=True)


if __name__ == "__main__":
    main()
