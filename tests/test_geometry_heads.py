"""Unit-norm classifier heads of the GNC paper: cosine, class-mean-feature (CMF) and fixed codes."""

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from kdcollapse.errors import KdcollapseError
from kdcollapse.geometry import ClassMeanFeatureHead, CosineHead, FixedHead, simplex_etf
from kdcollapse.models import Classifier


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
    torch.manual_seed(0)
    head = ClassMeanFeatureHead(3, 4)
    head.update(h[rank::world], y[rank::world])  # each process sees half the batch
    if rank == 0:
        torch.save(head.weight, out)
    dist.destroy_process_group()


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

