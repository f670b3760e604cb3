"""``kdcollapse.metrics.Metric``, the torchmetrics protocol without torchmetrics (issue 42): update / compute /
reset / merge_state / forward, and the states reduced across two gloo processes, each against the obvious
reference (the same numbers from one process holding all the data)."""

import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from kdcollapse.distributed import distributed_teardown
from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import Metric
from kdcollapse.metrics._metric import OPTIONS
from naming import raises_naming


class Moments(Metric):
    """A state of each reduction: the sum, the max, the concatenation of the values, and a custom one."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.add_state("total", torch.zeros(3, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("largest", torch.full((3,), -torch.inf, dtype=torch.float64), dist_reduce_fx="max")
        self.add_state("values", torch.zeros(0, 3, dtype=torch.float64), dist_reduce_fx="cat")
        self.add_state("first", torch.zeros(3, dtype=torch.float64), dist_reduce_fx=lambda stacked: stacked[0])
        self.computes = 0

    def update(self, x):
        x = x.double()
        self.total += x.sum(0)
        self.largest = torch.maximum(self.largest, x.amax(0))
        self.values = torch.cat([self.values, x])
        self.first = x[0]

    def compute(self):
        self.computes += 1
        return {"total": self.total.clone(), "largest": self.largest.clone(), "rows": self.values.shape[0]}


def _rows(seed, n):
    return torch.randn(n, 3, generator=torch.Generator().manual_seed(seed))


def test_update_compute_reset_and_the_cache():
    metric = Moments()
    x = _rows(0, 10)
    with pytest.warns(UserWarning, match="called before update"):
        metric.compute()
    metric.update(x[:4])
    metric.update(x[4:])
    first = metric.compute()
    assert torch.allclose(first["total"], x.double().sum(0)) and first["rows"] == 10
    assert torch.equal(first["largest"], x.double().amax(0))
    assert metric.compute() is first and metric.computes == 2  # cached until the next update
    assert metric.update_count == 2
    metric.reset()
    assert metric.update_count == 0 and not metric.total.any() and metric.values.shape == (0, 3)
    metric.update(x[:3])
    assert metric.compute()["rows"] == 3


def test_forward_gives_the_batch_alone_and_keeps_the_running_states():
    metric = Moments()
    x = _rows(1, 8)
    metric.update(x[:5])
    batch = metric(x[5:])
    assert batch["rows"] == 3 and torch.allclose(batch["total"], x[5:].double().sum(0))
    assert metric.compute()["rows"] == 8 and torch.allclose(metric.total, x.double().sum(0))


def test_merge_state_equals_one_metric_over_both_halves():
    x = _rows(2, 12)
    whole, first, second = Moments(), Moments(), Moments()
    whole.update(x)
    first.update(x[:7])
    second.update(x[7:])
    first.merge_state(second)
    assert torch.allclose(first.total, whole.total) and torch.equal(first.largest, whole.largest)
    assert torch.equal(first.values, whole.values) and torch.equal(first.first, whole.first)
    with pytest.raises(KdcollapseError, match=r"lacks \['values'\]"):
        first.merge_state({k: v for k, v in second.metric_state.items() if k != "values"})


def test_options_and_declarations_are_checked():
    with raises_naming(KdcollapseError, "sync_on_step", *OPTIONS):
        Moments(sync_on_step=True)
    with raises_naming(KdcollapseError, "'median'", "sum", "mean", "max", "min", "cat"):
        Metric().add_state("x", torch.zeros(1), dist_reduce_fx="median")
    with pytest.raises(KdcollapseError, match="is not synced"):
        Moments().unsync()


def test_device_moves_keep_dtypes_unless_set_dtype():
    metric = Moments().to(torch.device("cpu")).half().double()
    assert metric.total.dtype == torch.float64
    metric.set_dtype(torch.float32)
    assert metric.total.dtype == torch.float32 and metric._defaults["total"].dtype == torch.float32


def _worker(rank, world, port, out_dir):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    with distributed_teardown():
        metric = Moments()
        metric.update(_rows(10 + rank, 3 + 2 * rank))  # uneven row counts: "cat" gathers unequal shapes
        result = metric.compute()
        result["values"] = metric.values.clone()  # after compute: the local states are back
        with metric.sync_context():
            result["synced_values"], result["first"] = metric.values.clone(), metric.first.clone()
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))


def test_two_gloo_processes_reduce_every_state_as_one_process(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_worker, args=(2, port, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in range(2)]
    rows = [_rows(10, 3).double(), _rows(11, 5).double()]
    both = torch.cat(rows)
    for rank, got in enumerate(results):
        assert got["rows"] == 8 and torch.allclose(got["total"], both.sum(0))
        assert torch.equal(got["largest"], both.amax(0))
        assert torch.equal(got["synced_values"], both) and torch.equal(got["first"], rows[0][0])
        assert torch.equal(got["values"], rows[rank])
