"""Single-view loader cost before (commit 49c816e) and after the `views` option, alternating in one process.

    mkdir -p /tmp/oldloader && git show 49c816e:src/kdcollapse/data/_loader.py > /tmp/oldloader/loader_before_views.py
    OMP_NUM_THREADS=1 PYTHONPATH=src python results/intra_class/bench_single_view.py

Checks that both yield identical batches, then times 40 batches of 256 CIFAR-sized images (crop 4 + flip)
five times each, alternating.
"""
import statistics
import sys
import time

import torch

sys.path.insert(0, "/tmp/oldloader")
import loader_before_views as old  # noqa: E402
from kdcollapse.data import Augment, TensorDataset, make_loader  # noqa: E402

torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
n = 50000
inputs = torch.randint(0, 256, (n, 3, 32, 32), generator=g, dtype=torch.uint8)
ds = TensorDataset(inputs, torch.arange(n) % 100, [str(i) for i in range(100)], (0.5, 0.5, 0.5), (0.25, 0.25, 0.25), "bench")
def epoch_ms(make):
    loader = make(ds, 256, train=True, device="cpu", seed=0, augment=Augment(4, True))
    loader.set_epoch(1)
    it = iter(loader); next(it)
    t = time.perf_counter(); k = 0
    for _ in range(40):
        next(it); k += 1
    return (time.perf_counter() - t) / k * 1e3
# identical output first
a = make_loader(ds, 256, train=True, device="cpu", seed=0, augment=Augment(4, True))
b = old.make_loader(ds, 256, train=True, device="cpu", seed=0, augment=Augment(4, True))
for L in (a, b): L.set_epoch(3)
assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
before, after = [], []
for r in range(5):
    before.append(epoch_ms(old.make_loader)); after.append(epoch_ms(make_loader))
print("identical batches: yes")
print("before ms/batch:", [round(v, 2) for v in before])
print("after  ms/batch:", [round(v, 2) for v in after])
print("median ratio after/before: %.3f" % (statistics.median(after) / statistics.median(before)))
