"""The VCI paper §6.3 knobs of ``vanilla``: softmax temperature τ and the within-class cosine regulariser λ."""

import math

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.config import method_config
from kdcollapse.data import load_dataset
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.losses import within_class_cosine_distance
from kdcollapse.methods import build_method
from kdcollapse.metrics import FeatureStatistics
from tiny_models import LinearEmbedding


def vanilla(model, num_classes, **options):
    return build_method(method_config({"name": "vanilla", **options}), model, num_classes=num_classes)


def within_by_pairs(h, y):
    """(1/K_b) Σ_k (1/n_k²) Σ_{i,j∈k} (1 − cos(h_i, h_j)) in plain Python over the classes present."""
    h, y = h.double().tolist(), y.tolist()
    cos = lambda u, v: sum(a * b for a, b in zip(u, v)) / math.sqrt(sum(a * a for a in u) * sum(b * b for b in v))  # noqa: E731
    per_class = []
    for k in sorted(set(y)):
        members = [h[i] for i in range(len(y)) if y[i] == k]
        per_class.append(sum(1 - cos(u, v) for u in members for v in members) / len(members) ** 2)
    return sum(per_class) / len(per_class)


def test_within_class_cosine_distance_against_pairs_and_the_metric():
    torch.manual_seed(0)
    h, y = torch.randn(23, 5), torch.tensor([0] * 9 + [2] * 13 + [4])  # class 4 alone: distance 0
    assert within_class_cosine_distance(h, y).item() == pytest.approx(within_by_pairs(h, y), rel=1e-6)
    # With every class present it is the `cosine_within` metric of kdcollapse.metrics.
    stats = FeatureStatistics(num_classes=3, feature_dim=5)
    y3 = torch.tensor([0] * 9 + [1] * 13 + [2])
    stats.update(h.double(), y3)
    assert within_class_cosine_distance(h.double(), y3).item() == pytest.approx(
        stats.compute()["cosine_within"].item(), rel=1e-12)
    # Collapsed classes (positive multiples of one direction) score 0; gradients reach the features.
    collapsed = torch.tensor([[1.0, 2.0], [2.0, 4.0], [-3.0, 1.0], [-6.0, 2.0]], requires_grad=True)
    value = within_class_cosine_distance(collapsed, torch.tensor([0, 0, 1, 1]))
    assert value.item() == pytest.approx(0.0, abs=1e-7)
    within_class_cosine_distance(h.requires_grad_(), y).backward()
    assert h.grad is not None and h.grad.abs().sum() > 0
    with pytest.raises(KdcollapseError, match=r"labels must be integers of shape \(23,\)"):
        within_class_cosine_distance(h, y.float())


def test_temperature_and_cosine_weight_against_a_hand_computation():
    torch.manual_seed(1)
    model = LinearEmbedding(6, 4, 3)
    x, y = torch.randn(10, 6), torch.randint(0, 3, (10,))
    h = model.forward_features(x)
    z = model.forward_head(h)
    # τ: CE of softmax(z/τ), by hand; the reported logits stay z.
    out = vanilla(model, 3, temperature=0.25)(x, y)
    log_p = [[v / 0.25 - math.log(sum(math.exp(w / 0.25) for w in row)) for v in row] for row in z.tolist()]
    ce = -sum(log_p[b][y[b]] for b in range(10)) / 10
    assert out["loss"].item() == pytest.approx(ce, rel=1e-6)
    torch.testing.assert_close(out["logits"], z)
    # λ: + λ · d̄_within of the features.
    out = vanilla(model, 3, temperature=0.25, cosine_weight=3.0)(x, y)
    assert out["loss"].item() == pytest.approx(ce + 3.0 * within_by_pairs(h.detach(), y), rel=1e-6)
    assert out["cosine_within"].item() == pytest.approx(within_by_pairs(h.detach(), y), rel=1e-6)
    # Defaults: plain CE.
    assert vanilla(model, 3)(x, y)["loss"].item() == pytest.approx(F.cross_entropy(z, y).item(), rel=1e-6)


def cosine_within_after_training(cosine_weight: float, temperature: float = 1.0) -> float:
    data = load_dataset("gaussian_mixture", "train", num_classes=4, dim=8, n_per_class=15, seed=0)
    torch.manual_seed(0)
    model = LinearEmbedding(8, 16, 4)
    method = vanilla(model, 4, temperature=temperature, cosine_weight=cosine_weight)
    optimizer = torch.optim.SGD(method.parameters(), lr=0.2, momentum=0.9)
    for _ in range(60):
        optimizer.zero_grad()
        method(data.inputs, data.labels)["loss"].backward()
        optimizer.step()
    with torch.no_grad():
        return within_class_cosine_distance(model.forward_features(data.inputs), data.labels).item()


def test_larger_cosine_weight_collapses_directions_more():
    values = [cosine_within_after_training(lam) for lam in (0.0, 1.0, 10.0)]
    assert values[0] > values[1] > values[2], values
    assert values[2] < 0.5 * values[0], values


def test_bad_config():
    with pytest.raises(ConfigError, match="method.temperature must be > 0, got 0"):
        method_config({"name": "vanilla", "temperature": 0})
    with pytest.raises(ConfigError, match="method.cosine_weight must be >= 0, got -1"):
        method_config({"name": "vanilla", "cosine_weight": -1})
