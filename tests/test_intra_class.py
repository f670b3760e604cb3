"""The intra-class contrastive teacher: loss usage, margin gate, per-class pipelines, diagnostics, and
the direction of Theorem 2 on synthetic data."""

import math

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.config import method_config
from kdcollapse.data import load_dataset
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.losses import intra_class_contrastive_loss
from kdcollapse.methods import build_method
from kdcollapse.methods.intra_class_teacher import classification_margin
from kdcollapse.metrics import intra_inter_distances
from kdcollapse.models._base import Classifier
from tiny_models import LinearEmbedding
from naming import raises_naming


class Readout(Classifier):
    """Features = the input itself; logits = its first K coordinates (so a test sets both by hand)."""

    def __init__(self, dim: int, num_classes: int):
        super().__init__()
        self._init_head(dim, num_classes)
        with torch.no_grad():
            self.head.weight.copy_(torch.eye(num_classes, dim))
            self.head.bias.zero_()

    def forward_features(self, x):
        return x.flatten(1)


def teacher(num_classes=2, dim=3, **options):
    defaults = dict(intra_weight=0.5, margin_threshold=-1.0, cache_min_count=3, cache_capacity=8)
    cfg = method_config({"name": "intra_class_teacher", **defaults, **options})
    return build_method(cfg, Readout(dim, num_classes), num_classes=num_classes)


def unit(*v):
    n = math.sqrt(sum(c * c for c in v))
    return [c / n for c in v]


def dot(u, v):
    return sum(a * b for a, b in zip(u, v))


def tuplet(anchor, positive, negatives):
    """−log e^{a·p} / (e^{a·p} + Σ e^{a·n}) in plain Python (eq. 4, τ = 1)."""
    num = math.exp(dot(anchor, positive))
    return -math.log(num / (num + sum(math.exp(dot(anchor, n)) for n in negatives)))


def views(first, second):
    return torch.stack([torch.tensor(first), torch.tensor(second)], dim=1)  # (B, 2, d)


def test_loss_against_a_hand_computation():
    method = teacher()
    first = [[2.0, 0.1, 0.3], [1.5, -0.4, 0.8], [3.0, 0.5, -1.0], [0.2, 1.0, 0.5]]
    second = [[1.8, 0.3, 0.2], [1.2, -0.1, 1.0], [2.5, 0.9, -0.6], [0.1, 1.2, 0.4]]
    y = torch.tensor([0, 0, 0, 1])
    out = method(views(first, second), y)
    a, p = [unit(*v) for v in first], [unit(*v) for v in second]
    # Class 0 holds 3 >= cache_min_count gated samples: each is an anchor, the other two its negatives.
    # Class 1 holds 1 and waits in the cache.
    expected = sum(tuplet(a[i], p[i], [a[j] for j in range(3) if j != i]) for i in range(3)) / 3
    assert out["intra"].item() == pytest.approx(expected, rel=1e-6)
    ce = F.cross_entropy(torch.tensor(first)[:, :2], y)
    assert out["loss"].item() == pytest.approx(ce.item() + 0.5 * expected, rel=1e-6)
    assert method._cache["labels"].tolist() == [1]
    torch.testing.assert_close(method._cache["anchors"], torch.tensor([a[3]]))
    torch.testing.assert_close(method._cache["positives"], torch.tensor([p[3]]))


def test_temperature_is_passed_to_the_loss():
    method = teacher(temperature=0.5)
    first = [[2.0, 0.1, 0.3], [1.5, -0.4, 0.8], [3.0, 0.5, -1.0]]
    second = [[1.8, 0.3, 0.2], [1.2, -0.1, 1.0], [2.5, 0.9, -0.6]]
    out = method(views(first, second), torch.tensor([0, 0, 0]))
    a, p = [unit(*v) for v in first], [unit(*v) for v in second]
    halve = lambda u: [2 * c for c in u]  # noqa: E731  a·p / 0.5 = (2a)·p
    expected = sum(tuplet(halve(a[i]), p[i], [a[j] for j in range(3) if j != i]) for i in range(3)) / 3
    assert out["intra"].item() == pytest.approx(expected, rel=1e-6)


def test_margin_matches_a_loop_and_the_gate_is_strict():
    logits = torch.randn(50, 5)
    target = torch.randint(0, 5, (50,))
    rho = classification_margin(logits, target)
    for b in range(50):
        p = logits[b].softmax(0).tolist()
        best_other = max(p[j] for j in range(5) if j != target[b])
        assert rho[b].item() == pytest.approx(p[target[b]] - best_other, abs=1e-6)
    # The gate admits exactly the anchors with rho > delta: equal logits give rho = 0 = delta, left out.
    method = teacher(num_classes=2, dim=3, margin_threshold=0.0, cache_min_count=8)
    first = [[0.0, 0.0, 1.0], [1.0, 0.0, 0.5], [0.0, 2.0, 1.0], [0.3, 0.0, -1.0], [0.0, 0.2, 2.0]]
    y = torch.tensor([0, 0, 0, 1, 1])
    out = method(views(first, first), y)
    rho = classification_margin(torch.tensor(first)[:, :2], y)
    admitted = (rho > 0).nonzero().flatten().tolist()
    assert admitted == [1, 4] and rho[0] == 0  # sample 0 sits exactly on the threshold
    assert method._cache["labels"].tolist() == [0, 1] and out["intra"] == 0
    torch.testing.assert_close(method._cache["anchors"], F.normalize(torch.tensor(first)[[1, 4]], dim=1))
    assert method.epoch_metrics()["gate_fraction"] == pytest.approx(2 / 5)


def test_pipeline_per_class_capacity_clearing_and_minimum_count():
    method = teacher(num_classes=2, dim=3, cache_min_count=3, cache_capacity=4)
    torch.manual_seed(1)
    step = []

    def run(y):
        x = torch.randn(len(y), 2, 3, requires_grad=True)
        out = method(x, torch.tensor(y))
        step.append((x, F.normalize(x.detach(), dim=2)))
        return out

    # Step 1: two of class 0, one of class 1: no class reaches 3, nothing is computed, all are cached.
    out = run([0, 1, 0])
    assert out["intra"] == 0 and method._cache["labels"].tolist() == [0, 0, 1]
    assert not method._cache["anchors"].requires_grad
    # Step 2: a third of class 0 completes its pool (two cached + one new), which is used and cleared.
    out = run([0, 1])
    old, new = step[0][1], step[1][1]
    pool = [old[0], old[2], new[0]]  # oldest first
    expected = sum(tuplet(pool[i][0].tolist(), pool[i][1].tolist(),
                          [pool[j][0].tolist() for j in range(3) if j != i]) for i in range(3)) / 3
    assert out["intra"].item() == pytest.approx(expected, rel=1e-6)
    assert method._cache["labels"].tolist() == [1, 1]
    out["loss"].backward()
    assert step[0][0].grad is None  # cached embeddings are constants: nothing flows back to step 1
    positives_grad = step[1][0].grad[:, 1]  # second views get gradient from L_Intra only
    assert positives_grad[0].abs().sum() > 0 and positives_grad[1].abs().sum() == 0  # class 1 waits
    # Step 3: six more of class 1 make 8 > capacity 4: only the 4 newest enter the loss, then all is cleared.
    out = run([1] * 6)
    newest = step[2][1][2:]
    expected = sum(tuplet(newest[i][0].tolist(), newest[i][1].tolist(),
                          [newest[j][0].tolist() for j in range(4) if j != i]) for i in range(4)) / 4
    assert out["intra"].item() == pytest.approx(expected, rel=1e-6)
    assert len(method._cache["labels"]) == 0
    metrics = method.epoch_metrics()
    assert metrics["pool_size"] == pytest.approx((3 * 3 + 4 * 4) / 7)
    assert metrics["intra_loss"] > 0 and metrics["cache_fill"] == 0


def test_pools_of_different_sizes_equal_separate_unmasked_losses():
    # Class 0 has a pool of 3, class 1 of 5 in the same step: padding class 0's negatives to 5 with
    # masked slots must change neither the value nor the gradients.
    method = teacher(num_classes=2, dim=4, cache_min_count=3, cache_capacity=8)
    torch.manual_seed(2)
    x = torch.randn(8, 2, 4, requires_grad=True)
    y = torch.tensor([1, 0, 1, 1, 0, 1, 0, 1])
    method(x, y)["loss"].backward()
    x_ref = x.detach().clone().requires_grad_(True)
    a, p = F.normalize(x_ref[:, 0], dim=1), F.normalize(x_ref[:, 1], dim=1)
    total = 0
    for c in (0, 1):
        members = (y == c).nonzero().flatten()
        negatives = torch.stack([a[members[members != i]] for i in members])
        total = total + intra_class_contrastive_loss(a[members], p[members], negatives) * len(members)
    (F.cross_entropy(x_ref[:, 0, :2], y) + 0.5 * total / 8).backward()  # CE + λ·L_Intra, λ = 0.5
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_epoch_diagnostics_match_their_definitions():
    method = teacher(num_classes=3, dim=5, cache_min_count=2)
    torch.manual_seed(3)
    x, y = torch.randn(12, 2, 5), torch.tensor([0, 1, 2, 0, 1, 2, 0, 0, 1, 2, 2, 2])
    method.on_epoch_start(0)
    out = method(x, y)
    metrics = method.epoch_metrics()
    a, p = F.normalize(x[:, 0], dim=1), F.normalize(x[:, 1], dim=1)
    same = [(i, j) for i in range(12) for j in range(12) if i != j and y[i] == y[j]]
    other = [(i, j) for i in range(12) for j in range(12) if y[i] != y[j]]
    d_intra = sum(math.exp(a[i] @ a[j]) for i, j in same) / len(same)
    d_inter = sum(math.exp(a[i] @ a[j]) for i, j in other) / len(other)
    assert metrics["d_intra"] == pytest.approx(d_intra, rel=1e-6)
    assert metrics["d_inter"] == pytest.approx(d_inter, rel=1e-6)
    assert metrics["d_ratio"] == pytest.approx(d_intra / d_inter, rel=1e-6)
    for name, related in (("tuplet_intra", lambda i, j: y[i] == y[j]), ("tuplet_inter", lambda i, j: y[i] != y[j])):
        terms = [tuplet(a[i].tolist(), p[i].tolist(), [a[j].tolist() for j in range(12) if j != i and related(i, j)])
                 for i in range(12)]
        assert metrics[name] == pytest.approx(sum(terms) / 12, rel=1e-6)
    assert metrics["tuplet_ratio"] == pytest.approx(metrics["tuplet_intra"] / metrics["tuplet_inter"])
    assert metrics["gate_fraction"] == 1.0
    assert metrics["intra_loss"] == pytest.approx(out["intra"].item())  # every class's pool was used
    assert metrics["pool_size"] == pytest.approx((4 * 4 + 3 * 3 + 5 * 5) / 12)
    method.on_epoch_start(1)
    assert math.isnan(method.epoch_metrics()["d_intra"])  # reset at the epoch start


def test_intra_inter_distances_in_blocks_match_a_loop():
    torch.manual_seed(4)
    h, y = torch.randn(30, 6), torch.randint(0, 4, (30,))
    a, y = F.normalize(h.double(), dim=1).tolist(), y.tolist()
    same = [math.exp(dot(a[i], a[j])) for i in range(30) for j in range(30) if i != j and y[i] == y[j]]
    other = [math.exp(dot(a[i], a[j])) for i in range(30) for j in range(30) if y[i] != y[j]]
    for block in (7, 30, 100):
        got = intra_inter_distances(h, torch.tensor(y), block_size=block)
        assert got == pytest.approx((sum(same) / len(same), sum(other) / len(other)), rel=1e-6)


def spread_after_training(intra_weight: float, seed: int) -> tuple[float, float]:
    """Train a linear embedding + head on a 4-class Gaussian mixture with the method; (d_intra, accuracy)."""
    data = load_dataset("gaussian_mixture", "train", num_classes=4, dim=8, n_per_class=15, seed=seed)
    torch.manual_seed(seed)
    model = LinearEmbedding(8, 16, 4)
    cfg = method_config({"name": "intra_class_teacher", "intra_weight": intra_weight, "margin_threshold": 0.0,
                         "cache_min_count": 8, "cache_capacity": 64})
    method = build_method(cfg, model, num_classes=4)
    optimizer = torch.optim.SGD(method.parameters(), lr=0.2, momentum=0.9)
    g = torch.Generator().manual_seed(seed)
    x, y = data.inputs, data.labels
    for _ in range(40):
        augmented = x[:, None] + 0.3 * torch.randn(len(x), 2, 8, generator=g)  # two views per point
        optimizer.zero_grad()
        method(augmented, y)["loss"].backward()
        optimizer.step()
    with torch.no_grad():
        accuracy = (model(x).argmax(1) == y).float().mean().item()
        return intra_inter_distances(model.forward_features(x), y)[0], accuracy


@pytest.mark.parametrize("seed", [0, 1])
def test_larger_weight_spreads_classes_more(seed):
    # Theorem 2: the minimiser's L_Intra / L_Inter falls as λ grows, i.e. same-class embeddings move
    # apart: d_intra = E exp(φᵀφ⁻) over same-class pairs decreases. CE alone (λ = 0) collapses classes.
    results = [spread_after_training(lam, seed) for lam in (0.0, 0.3, 1.0)]
    d_intra = [d for d, _ in results]
    assert d_intra[0] > 1.9  # collapsed: close to e = 2.72 means nearly identical directions
    assert d_intra[0] - d_intra[1] > 0.05 and d_intra[1] - d_intra[2] > 0.3, d_intra
    assert all(acc >= 0.95 for _, acc in results)  # still a classifier


def test_bad_config_and_inputs():
    with raises_naming(ConfigError, "method.cache_capacity (4)", "method.cache_min_count (8)"):
        teacher(cache_capacity=4, cache_min_count=8)
    with pytest.raises(ConfigError, match="cache_min_count must be >= 2"):
        teacher(cache_min_count=1)
    with pytest.raises(ConfigError, match=r"margin_threshold \(δ\) must lie in \[-1, 1\)"):
        teacher(margin_threshold=1.0)
    with pytest.raises(ConfigError, match=r"intra_weight \(λ\) must be >= 0.*temperature must be > 0"):
        teacher(intra_weight=-0.1, temperature=0)
    with pytest.raises(ConfigError, match="unknown key 'method.lambda'"):
        method_config({"name": "intra_class_teacher", "lambda": 0.1})
    method = teacher()
    with raises_naming(KdcollapseError, "(B, 2, ...)", "(4, 3)"):
        method(torch.randn(4, 3), torch.zeros(4, dtype=torch.long))
    with pytest.raises(CheckpointError, match=r"cache does not fit this model.*\(n, 3\)"):
        method.load_extra_state({"cache_anchors": torch.zeros(2, 5), "cache_positives": torch.zeros(2, 5),
                                 "cache_labels": torch.zeros(2, dtype=torch.long)})


def test_loss_on_raw_classifier_outputs_as_written():
    # embedding: logits, normalize: false: eq. 4 on f(x) itself, f(x)ᵀf(x⁺) of the raw outputs; the
    # Readout's outputs are the first K = 2 input coordinates. The cache then holds K-dimensional rows.
    method = teacher(embedding="logits", normalize=False, temperature=2.0)
    first = [[2.0, 0.1, 0.3], [1.5, -0.4, 0.8], [3.0, 0.5, -1.0], [0.2, 1.0, 0.5]]
    second = [[1.8, 0.3, 0.2], [1.2, -0.1, 1.0], [2.5, 0.9, -0.6], [0.1, 1.2, 0.4]]
    out = method(views(first, second), torch.tensor([0, 0, 0, 1]))
    a, p = [[c / 2.0 for c in v[:2]] for v in first], [v[:2] for v in second]  # a·p / τ = (a/τ)·p
    raw = [v[:2] for v in first]
    expected = sum(tuplet(a[i], p[i], [raw[j] for j in range(3) if j != i]) for i in range(3)) / 3
    assert out["intra"].item() == pytest.approx(expected, rel=1e-6)
    assert method.embedding_dim == 2
    torch.testing.assert_close(method._cache["anchors"], torch.tensor([[0.2, 1.0]]))
    # Normalised outputs: the same with unit K-vectors.
    method = teacher(embedding="logits")
    out = method(views(first, second), torch.tensor([0, 0, 0, 1]))
    a, p = [unit(*v[:2]) for v in first], [unit(*v[:2]) for v in second]
    expected = sum(tuplet(a[i], p[i], [a[j] for j in range(3) if j != i]) for i in range(3)) / 3
    assert out["intra"].item() == pytest.approx(expected, rel=1e-6)
    with pytest.raises(ConfigError, match="method.embedding"):
        teacher(embedding="penultimate")
