"""Unit-norm classifier heads of the GNC paper: cosine, class-mean-feature (CMF) and fixed codes."""

import json
import math

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry import (
    SphericalCode,
    closed_form_code,
    one_vs_one_distance,
    one_vs_rest_distances,
    simplex_etf,
    softmax_code_optimum,
)
from kdcollapse.models import Classifier
from kdcollapse.models.heads import ClassMeanFeatureHead, CosineHead, FixedHead, head_from_spec, make_code, make_head
from kdcollapse.distributed import distributed_teardown
from naming import raises_naming


class TinyNet(Classifier):
    def __init__(self, num_classes: int = 4, dim: int = 3):
        super().__init__()
        self.body = nn.Linear(5, dim)
        self._init_head(dim, num_classes)

    def forward_features(self, x):
        return self.body(x)


def cosine_logits(h, w, tau):
    return torch.stack([torch.stack([F.cosine_similarity(a, b, dim=0) for b in w]) for a in h]) / tau


def test_cosine_head_logits_and_gradients():
    head = CosineHead(3, 4, temperature=0.2)
    h = torch.randn(6, 3)
    logits = head(h)
    assert torch.allclose(logits, cosine_logits(h, head.weight.detach(), 0.2), atol=1e-5)
    assert torch.allclose(head(7 * h), logits, atol=1e-5)  # features are normalised
    logits.sum().backward()
    assert head.weight.grad is not None and head.weight.grad.abs().sum() > 0


def test_heads_replace_the_head_of_a_classifier():
    model = TinyNet()
    model.head = ClassMeanFeatureHead(model.feature_dim, model.num_classes)
    assert model(torch.randn(2, 5)).shape == (2, 4)
    assert [name for name, _ in model.named_parameters()] == ["body.weight", "body.bias"]
    assert "head.weight" in model.state_dict()  # a buffer: checkpointed, never optimised


def test_class_mean_feature_update_rule():
    torch.manual_seed(0)
    head = ClassMeanFeatureHead(3, 4, beta=0.9, temperature=0.1)
    before = head.weight.clone()
    h = torch.randn(7, 3, requires_grad=True)
    y = torch.tensor([0, 0, 2, 2, 2, 3, 0])
    head(h).sum().backward()
    assert h.grad is not None  # gradients reach the features, nothing else is trainable
    head.update(h, y)
    hn = F.normalize(h.detach(), dim=1)
    for k in (0, 2, 3):
        expected = F.normalize(0.9 * before[k] + 0.1 * hn[y == k].mean(0), dim=0)
        assert torch.allclose(head.weight[k], expected, atol=1e-6)
    assert torch.equal(head.weight[1], before[1])  # absent class untouched
    assert torch.allclose(head.weight.norm(dim=1), torch.ones(4))
    assert not head.weight.requires_grad


@pytest.mark.parametrize(
    "features,labels,message",
    [
        (torch.randn(3, 2), torch.tensor([0, 1, 2]), "expects"),
        (torch.randn(3, 3), torch.tensor([0, 1, 4]), "labels must lie"),
        (torch.full((2, 3), float("nan")), torch.tensor([0, 1]), "NaN"),
    ],
)
def test_class_mean_feature_update_rejects_bad_input(features, labels, message):
    with pytest.raises(KdcollapseError, match=message):
        ClassMeanFeatureHead(3, 4).update(features, labels)


def _ddp_update(rank: int, world: int, init_file: str, h: torch.Tensor, y: torch.Tensor, out: str):
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    with distributed_teardown():
        torch.manual_seed(0)
        head = ClassMeanFeatureHead(3, 4)
        head.update(h[rank::world], y[rank::world])  # each process sees half the batch
        if rank == 0:
            torch.save(head.weight, out)


def test_class_mean_feature_update_is_synchronised_under_ddp(tmp_path):
    h, y = torch.randn(10, 3), torch.tensor([0, 1, 1, 3, 0, 0, 3, 1, 1, 1])
    out = str(tmp_path / "w.pt")
    # fork: the children inherit the imported modules (a fresh interpreter would import torch again)
    mp.start_processes(_ddp_update, args=(2, str(tmp_path / "init"), h, y, out), nprocs=2, start_method="fork")
    torch.manual_seed(0)
    single = ClassMeanFeatureHead(3, 4)
    single.update(h, y)  # one process, whole batch
    assert torch.allclose(torch.load(out, weights_only=True), single.weight, atol=1e-6)


def test_fixed_head_assignment():
    code = simplex_etf(4, 3) * torch.tensor([[1.0], [2.0], [3.0], [4.0]], dtype=torch.float64)  # rows get normalised
    assignment = [2, 0, 3, 1]
    head = FixedHead(code, assignment, temperature=0.5)
    h = torch.randn(5, 3)
    expected = cosine_logits(h, F.normalize(code.float(), dim=1)[assignment], 0.5)
    assert torch.allclose(head(h), expected, atol=1e-5)
    assert list(head.parameters()) == []


@pytest.mark.parametrize(
    "code,assignment,message",
    [
        (torch.eye(3), [0, 0, 1], "permutation"),
        (torch.eye(3), [0, 1], "permutation"),
        (torch.ones(1, 3), None, "at least 2 classes"),
        (torch.tensor([[1.0, float("nan")], [0.0, 1.0]]), None, "NaN"),
    ],
)
def test_fixed_head_rejects_bad_codes(code, assignment, message):
    with pytest.raises(KdcollapseError, match=message):
        FixedHead(code, assignment)


def test_heads_reject_bad_configuration_and_shapes():
    with pytest.raises(KdcollapseError, match="temperature"):
        CosineHead(3, 4, temperature=0)
    with pytest.raises(KdcollapseError, match="beta"):
        ClassMeanFeatureHead(3, 4, beta=1.0)
    with pytest.raises(KdcollapseError, match="num_classes >= 2"):
        CosineHead(3, 1)
    with pytest.raises(KdcollapseError, match=r"expects \(B, 3\)"):
        CosineHead(3, 4)(torch.randn(2, 4))



# ------------------------------------------------------------------ closed-form codes, make_head, specs
@pytest.mark.parametrize("K,d", [(2, 1), (3, 2), (5, 2), (8, 2), (4, 3), (3, 5), (5, 3), (6, 3), (7, 4), (8, 4)])
def test_closed_form_codes_reach_theorem_3_3(K, d):
    W = closed_form_code(K, d)
    assert W.shape == (K, d) and torch.allclose(W.norm(dim=1), torch.ones(K, dtype=torch.float64))
    assert one_vs_rest_distances(W).min().item() == pytest.approx(softmax_code_optimum(K, d), abs=1e-12)
    # ... and a Tammes code: the regular polygon, the simplex, or 90 degrees (Rankin) for d + 1 < K <= 2d
    angle = 360 / K if d == 2 else (math.degrees(math.acos(-1 / (K - 1))) if K <= d + 1 else 90.0)
    assert one_vs_one_distance(W) == pytest.approx(2 * math.sin(math.radians(angle) / 2), abs=1e-12)


def test_closed_form_circle_is_in_angular_order_and_none_beyond_theorem_3_3():
    angles = torch.atan2(*closed_form_code(6, 2).flip(1).T) % (2 * math.pi)
    assert torch.allclose(angles, torch.arange(6, dtype=torch.float64) * math.pi / 3, atol=1e-12)
    assert closed_form_code(10, 3) is None and closed_form_code(3, 1) is None


def test_make_code_sources(tmp_path, monkeypatch):
    assert torch.allclose(make_code("softmax", 4, 3), closed_form_code(4, 3), rtol=0, atol=1e-15)
    assert torch.allclose(make_code("tammes", 8, 2), closed_form_code(8, 2), rtol=0, atol=1e-15)
    assert torch.allclose(make_code("etf", 4, 5), simplex_etf(4, 5))
    calls = []

    def fake_solver(K, d, *, restarts, seed):
        calls.append((K, d, restarts, seed))
        return SphericalCode("softmax", torch.randn(K, d, dtype=torch.float64), 0.5, 0.5, [0.5])

    monkeypatch.setattr("kdcollapse.models.heads.softmax_code", fake_solver)
    assert make_code("softmax", 10, 3).shape == (10, 3) and calls == [(10, 3, 8, 0)]  # no closed form: numeric
    W = torch.randn(5, 3, dtype=torch.float64)
    np.save(tmp_path / "w.npy", (3 * W).numpy())
    assert torch.allclose(make_code(str(tmp_path / "w.npy"), 5, 3), F.normalize(W, dim=1))
    with raises_naming(KdcollapseError, "(5, 3)", "(5, 4)"):
        make_code(str(tmp_path / "w.npy"), 5, 4)
    with pytest.raises(KdcollapseError, match="unknown code 'cube'"):
        make_code("cube", 8, 3)


def _heads():
    torch.manual_seed(0)
    return [CosineHead(3, 4, temperature=0.3), ClassMeanFeatureHead(3, 4, beta=0.7, temperature=0.2),
            FixedHead(torch.randn(4, 3), [2, 3, 1, 0], temperature=0.5)]


@pytest.mark.parametrize("index", range(3))
def test_head_from_spec_rebuilds_each_head(index):
    head = _heads()[index]
    if isinstance(head, ClassMeanFeatureHead):
        head.update(torch.randn(8, 3), torch.arange(8) % 4)
    spec = head.spec()
    assert json.loads(json.dumps(spec)) == spec  # stored as JSON in model files
    rebuilt = head_from_spec(spec, head.state_dict())
    rebuilt.load_state_dict(head.state_dict())
    assert type(rebuilt) is type(head) and rebuilt.spec() == spec
    h = torch.randn(5, 3)
    assert torch.equal(rebuilt(h), head(h))
    if isinstance(head, FixedHead):  # rebuilt from its own tensors: loading the state changes nothing
        fresh = head_from_spec(spec, head.state_dict())
        assert torch.equal(fresh.weight, head.weight) and torch.equal(fresh.assignment, head.assignment)


def test_make_head_and_head_from_spec_reject_bad_input():
    with pytest.raises(KdcollapseError, match="unknown head 'arc'. Valid choices: cmf, cosine, fixed"):
        make_head("arc", 3, 4)
    with pytest.raises(KdcollapseError, match="a fixed head needs a code"):
        make_head("fixed", 3, 4)
    with pytest.raises(KdcollapseError, match="needs a \\(K, d\\) tensor head.weight"):
        head_from_spec({"kind": "cosine"}, {})
    with pytest.raises(KdcollapseError, match="needs the tensor head.assignment"):
        head_from_spec({"kind": "fixed"}, {"weight": torch.eye(3)})
    with pytest.raises(KdcollapseError, match="unknown head kind in the model file 'linear'"):
        head_from_spec({"kind": "linear"}, {"weight": torch.eye(3)})
