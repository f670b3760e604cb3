"""`analyze` with its defaults against a bare forward pass over the same images (target <= 1.3x).

The subject is a convnet (randomly initialised: the cost does not depend on the weights) on the
Fashion-MNIST test split (10,000 images; the digits test split when Fashion-MNIST is absent). "bare
forward" iterates the same loader and calls the model under `no_grad`; "analyze" is the library call
behind `kdcollapse analyze` (statistics, margins, NC4 sample, report and the two default figures).
Also timed: analyze with t-SNE (200 points per class) and with bf16 + channels_last. Rounds are
interleaved, one process; ratios are medians over rounds.

    PYTHONPATH=src python benchmarks/bench_analyze.py --threads 1 --rounds 3
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time

import torch

from _timing import machine  # benchmarks/_timing.py
from kdcollapse.analysis import AnalyzeOptions, Subject, analyze
from kdcollapse.data import load_dataset, make_loader
from kdcollapse.errors import DataError
from kdcollapse.models import create_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="convnet")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    try:
        dataset = load_dataset("fashion_mnist", "test")
    except DataError:
        dataset = load_dataset("digits", "test")
    torch.manual_seed(0)
    model = create_model(args.model, dataset.num_classes, in_channels=dataset.in_channels).to(device).eval()
    loader = make_loader(dataset, 512, train=False, device=device, seed=0)
    out = tempfile.mkdtemp()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def bare():
        with torch.no_grad():
            for x, _ in loader:
                model(x)
        sync()

    def run(**options):
        fresh = create_model(args.model, dataset.num_classes, in_channels=dataset.in_channels).to(device)
        fresh.load_state_dict(model.state_dict())
        return lambda: analyze(Subject(fresh, dataset, "test"), out, AnalyzeOptions(progress=False, **options))

    cases = {"bare forward": bare, "analyze (defaults)": run(),
             "analyze --tsne-per-class 200": run(tsne_per_class=200),
             "analyze --precision bf16 --channels-last": run(precision="bf16", channels_last=True)}
    for case in cases.values():  # warm-up: loads matplotlib, scikit-learn, oneDNN kernels
        case()
    times = {name: [] for name in cases}
    rng = random.Random(0)
    for _ in range(args.rounds):
        order = list(cases)
        rng.shuffle(order)
        for name in order:
            start = time.perf_counter()
            cases[name]()
            times[name].append(time.perf_counter() - start)
    print(f"# {machine(device)}; {args.model} on {dataset.name} test "
          f"({len(dataset)} images), {args.rounds} interleaved rounds\n")
    base = statistics.median(times["bare forward"])
    print("| case | median s | ratio to bare forward |\n|---|---|---|")
    for name, values in times.items():
        print(f"| {name} | {statistics.median(values):.2f} | {statistics.median(values) / base:.2f} |")


if __name__ == "__main__":
    main()
