"""The metric catalogue (one declaration per metric, docs and analysis derived from it), the one margin
function, and the intra-class similarity metric against a loop and across two gloo processes."""

from __future__ import annotations

import doctest
import math
import os
import re
import socket
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

import kdcollapse.adversarial
import kdcollapse.analysis
from kdcollapse.analysis import EPOCH_KEYS, MEANINGS
from kdcollapse.distributed import distributed_teardown
from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import (
    METRICS,
    FeatureStatistics,
    IntraClassSimilarity,
    collapse_metrics,
    margin,
    metric_info,
    ncc_accuracy,
)

DOCS = Path(__file__).resolve().parents[1] / "docs" / "metrics.md"


def names(**where) -> set[str]:
    """The catalogue's metric keys whose fields have the given values (``source=...``, ``prior_weighted=...``)."""
    return {m.name for m in METRICS if all(getattr(m, k) == v for k, v in where.items())}


# ------------------------------------------------------------------------------------------- catalogue
def test_every_returned_key_is_catalogued_and_every_catalogued_key_returned():
    g = torch.Generator().manual_seed(0)
    labels = torch.arange(4).repeat(6)
    features = 3 * torch.eye(4, 5)[labels] + torch.randn(24, 5, generator=g)
    weight = torch.randn(4, 5, generator=g)
    stats = FeatureStatistics(4, 5)
    stats.update(features, labels)
    assert set(collapse_metrics(stats)) == names(source="collapse_metrics", needs_classifier=False, needs_ood=False)
    assert set(collapse_metrics(stats, weight)) == names(source="collapse_metrics", needs_ood=False)
    assert set(collapse_metrics(stats, weight, ood_mean=torch.ones(5))) == names(source="collapse_metrics")
    assert set(ncc_accuracy(features, labels, stats.class_means(), features @ weight.T)) == names(
        source="NearestClassMeanAccuracy")
    similarity = IntraClassSimilarity()
    similarity.update(F.normalize(features, dim=1), F.normalize(features, dim=1), labels)
    assert set(similarity.compute()) == names(source="IntraClassSimilarity") == set(IntraClassSimilarity.KEYS)
    assert len({m.name for m in METRICS}) == len(METRICS)


def docs_tables(text: str | None = None) -> dict[str, str]:
    """key -> paper cell, from every ``| key | definition | paper |`` table of ``text`` (docs/metrics.md)."""
    rows, in_table = {}, False
    for line in (DOCS.read_text() if text is None else text).splitlines():
        if line.startswith("| key | definition | paper |"):
            in_table = True
        elif in_table and line.startswith("|") and not line.startswith("|---"):
            cells = [c.strip() for c in line.strip("|").split(" | ")]
            for key in re.findall(r"`([a-z0-9_]+)`", cells[0]):
                rows[key] = cells[-1]
        elif not line.startswith("|"):
            in_table = False
    return rows


def test_docs_list_exactly_the_catalogue_with_its_papers():
    documented = docs_tables()
    assert set(documented) == names()
    for key, paper in documented.items():
        assert paper == metric_info(key).paper, key


def test_meanings_and_epoch_keys_come_from_the_catalogue():
    assert EPOCH_KEYS == tuple(m.name for m in METRICS if m.per_epoch)
    for m in METRICS:
        assert MEANINGS[m.name] == m.meaning and m.meaning and "\n" not in m.meaning
    # the per-epoch set: what the trainer logged before the catalogue, plus the other two metrics of the VCI
    # paper's Fig. 3 (squared distance, within-class cosine distance)
    assert EPOCH_KEYS == ("nc1", "vci", "linear_probe_mse", "squared_distance", "cosine_within", "class_separation",
                          "nc2_equiangle", "nc3", "gnc1", "gnc3", "ncc_accuracy")
    with pytest.raises(KdcollapseError, match="unknown metric 'nc9'. Did you mean .*'nc1'"):
        metric_info("nc9")


# ------------------------------------------------------------------------------------------------ margin
def test_margin_matches_a_loop_and_is_the_one_function_everywhere():
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(30, 6, generator=g)
    scores[0, 2] = scores[0, 4]  # a tie between the target and another class gives 0
    target = torch.randint(0, 6, (30,), generator=g)
    target[0] = 2
    expected = [scores[i, target[i]] - max(scores[i, j] for j in range(6) if j != target[i]) for i in range(30)]
    assert margin(scores, target).tolist() == torch.stack(expected).tolist()
    assert margin(scores, target)[0] == 0
    assert kdcollapse.adversarial.margin is margin and kdcollapse.analysis.logit_margins is margin


# ------------------------------------------------------------------------------- intra-class similarity
def _loop_reference(batches) -> dict[str, float]:
    """d_intra, d_inter and the tuplet losses straight from their definitions, pairs within a batch."""
    same, other, intra, inter = [], [], [], []
    for phi, positives, y in batches:
        for i in range(len(y)):
            for j in range(len(y)):
                if i != j:
                    (same if y[i] == y[j] else other).append(math.exp(float(phi[i] @ phi[j])))
            pos = float(phi[i] @ positives[i])
            for negatives, out in (([j for j in range(len(y)) if j != i and y[j] == y[i]], intra),
                                   ([j for j in range(len(y)) if y[j] != y[i]], inter)):
                if negatives:
                    total = math.exp(pos) + sum(math.exp(float(phi[i] @ phi[j])) for j in negatives)
                    out.append(math.log(total) - pos)
    mean = lambda v: sum(v) / len(v)  # noqa: E731
    d_intra, d_inter, t_intra, t_inter = mean(same), mean(other), mean(intra), mean(inter)
    return {"d_intra": d_intra, "d_inter": d_inter, "d_ratio": d_intra / d_inter, "tuplet_intra": t_intra,
            "tuplet_inter": t_inter, "tuplet_ratio": t_intra / t_inter}


def _batches(seed: int = 2):
    g = torch.Generator().manual_seed(seed)
    out = []
    for n in (7, 9, 5, 8):
        phi = F.normalize(torch.randn(n, 4, generator=g, dtype=torch.float64), dim=1).float()
        positives = F.normalize(phi + 0.3 * torch.randn(n, 4, generator=g), dim=1)
        out.append((phi, positives, torch.randint(0, 3, (n,), generator=g)))
    return out


def test_intra_class_similarity_matches_a_loop_and_merges():
    batches = _batches()
    expected = _loop_reference(batches)
    whole, first, second = IntraClassSimilarity(), IntraClassSimilarity(), IntraClassSimilarity()
    for i, batch in enumerate(batches):
        whole.update(*batch)
        (first if i < 2 else second).update(*batch)
    first.merge_state(second)
    for metric in (whole, first):
        got = {k: float(v) for k, v in metric.compute().items()}
        assert got == pytest.approx(expected, rel=1e-5)
    one_class = IntraClassSimilarity()
    one_class.update(*[t[:3] for t in batches[0][:2]], torch.zeros(3, dtype=torch.long))
    assert math.isnan(float(one_class.compute()["d_inter"]))  # no pair of different classes: nan, not 0
    with pytest.raises(KdcollapseError, match=r"anchors and positives of one shape \(B, d\)"):
        IntraClassSimilarity().update(torch.zeros(3, 2), torch.zeros(3, 4), torch.zeros(3, dtype=torch.long))


def _gloo_worker(rank: int, port: int, out_dir: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    with distributed_teardown():  # a barrier before the group is destroyed (results/ddp_teardown_soak.md)
        metric = IntraClassSimilarity()
        for batch in _batches()[rank::2]:
            metric.update(*batch)
        torch.save(metric.compute(), os.path.join(out_dir, f"rank{rank}.pt"))


def test_intra_class_similarity_two_gloo_processes_equal_one(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(_gloo_worker, args=(port, str(tmp_path)), nprocs=2, join=True, start_method="fork")
    single = IntraClassSimilarity()
    for batch in _batches():
        single.update(*batch)
    expected = single.compute()
    for rank in range(2):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        for key in expected:
            torch.testing.assert_close(got[key], expected[key], rtol=1e-12, atol=0)


def test_docstring_examples_run():
    from kdcollapse.metrics import _catalog, _intra_class, _margin
    from kdcollapse.methods import _class_means

    for module in (_catalog, _intra_class, _margin, _class_means):
        assert doctest.testmod(module).failed == 0, module.__name__
