"""Single-view loader cost before the `views` option (commit 49c816e) and after it, alternating in one process.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_single_view.py

The "before" loader is read from the repository's own history (``git show 49c816e:...``), so this runs in a
git checkout. Checks that both yield identical batches, then times 40 batches of 256 CIFAR-sized images
(crop 4 + flip) five times each, alternating. Results: results/benchmarks/bench_single_view.md.
"""

import statistics
import subprocess
import time
import types
from pathlib import Path

import torch

from kdcollapse.data import Augment, TensorDataset, make_loader

BEFORE = "49c816e"  # the last commit before `views`


def loader_before_views() -> types.ModuleType:
    """``kdcollapse.data._loader`` as it was at BEFORE, as a module."""
    repo = Path(__file__).resolve().parents[1]
    source = subprocess.run(["git", "-C", str(repo), "show", f"{BEFORE}:src/kdcollapse/data/_loader.py"],
                            check=True, capture_output=True, text=True).stdout
    module = types.ModuleType("loader_before_views")
    exec(compile(source, f"{BEFORE}:_loader.py", "exec"), module.__dict__)
    return module


def ms_per_batch(make, dataset, batches: int = 40) -> float:
    loader = make(dataset, 256, train=True, device="cpu", seed=0, augment=Augment(4, True))
    loader.set_epoch(1)
    it = iter(loader)
    next(it)  # warm-up
    start = time.perf_counter()
    for _ in range(batches):
        next(it)
    return (time.perf_counter() - start) / batches * 1e3


def main() -> None:
    torch.set_num_threads(1)
    old = loader_before_views()
    g = torch.Generator().manual_seed(0)
    n = 50000
    inputs = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
    dataset = TensorDataset(inputs, torch.arange(n) % 100, [str(i) for i in range(100)], (0.5, 0.5, 0.5),
                            (0.25, 0.25, 0.25), "bench")
    a = make_loader(dataset, 256, train=True, device="cpu", seed=0, augment=Augment(4, True))
    b = old.make_loader(dataset, 256, train=True, device="cpu", seed=0, augment=Augment(4, True))
    for loader in (a, b):
        loader.set_epoch(3)
    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    before, after = [], []
    for _ in range(5):
        before.append(ms_per_batch(old.make_loader, dataset))
        after.append(ms_per_batch(make_loader, dataset))
    print("identical batches: yes")
    print("before ms/batch:", [round(v, 2) for v in before])
    print("after  ms/batch:", [round(v, 2) for v in after])
    print(f"median ratio after/before: {statistics.median(after) / statistics.median(before):.3f}")


if __name__ == "__main__":
    main()
