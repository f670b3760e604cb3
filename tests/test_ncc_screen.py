"""NC4's float32 screening with a float64 re-check of near ties (``kdcollapse.metrics._ncc._nearest``): the same
answers as the float64 computation, including constructed near ties that float32 alone gets wrong."""

import pytest
import torch

import kdcollapse.metrics._ncc as ncc
from kdcollapse.metrics import NearestClassMeanAccuracy, nearest_class_mean


def float64_nearest(features, means):
    """The float64 computation (the code before the screening): about the mean of the class means."""
    means = means.double()
    centre = means.mean(0)
    centred = means - centre
    h = features.double() - centre
    return (centred.square().sum(1) - 2 * h @ centred.mT).argmin(1)


def near_ties(seed, num=300, dim=64, rows=2000, offset=50.0):
    """Features on (or within about 1e-8 of) the bisector of two random class means, far from the origin."""
    g = torch.Generator().manual_seed(seed)
    means = offset + torch.randn(num, dim, generator=g, dtype=torch.float64)
    a, b = torch.randint(0, num, (rows,), generator=g), torch.randint(0, num, (rows,), generator=g)
    b = torch.where(a == b, (b + 1) % num, b)
    t = 0.5 + 1e-8 * torch.randn(rows, 1, generator=g, dtype=torch.float64)
    features = t * means[a] + (1 - t) * means[b]
    return features, means


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_screened_answers_equal_float64_on_near_ties(seed):
    features, means = near_ties(seed)
    assert torch.equal(nearest_class_mean(features, means), float64_nearest(features, means))
    metric = NearestClassMeanAccuracy(means)
    metric.update(features, float64_nearest(features, means))
    assert float(metric.compute()["ncc_accuracy"]) == 1.0


def test_without_the_recheck_float32_gets_near_ties_wrong(monkeypatch):
    """The test above can fail: with a zero error bound (no row re-checked) float32 alone disagrees with float64."""
    features, means = near_ties(0)
    monkeypatch.setattr(ncc, "_UNIT", 0.0)
    assert not torch.equal(nearest_class_mean(features, means), float64_nearest(features, means))


def test_exact_ties_are_broken_as_the_float64_computation_breaks_them():
    means = torch.tensor([[0.0, 0.0], [2.0, 0.0], [0.0, 2.0]], dtype=torch.float64)
    features = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [3.0, 3.0]], dtype=torch.float64)
    assert nearest_class_mean(features, means).tolist() == float64_nearest(features, means).tolist()


def test_float32_means_give_the_float64_answer_on_those_means():
    features, means = near_ties(3)
    means32 = means.float()
    centre, centred, norms = ncc.centred_means(means32)  # the metric's one copy, centred in float32
    assert centred.dtype == norms.dtype == torch.float32
    expected = (norms.double() - 2 * (features.double() - centre) @ centred.double().mT).argmin(1)
    assert torch.equal(nearest_class_mean(features, means32), expected)


def test_blocks_and_random_data_agree_with_brute_force(monkeypatch):
    g = torch.Generator().manual_seed(5)
    means, features = torch.randn(500, 16, generator=g), torch.randn(3000, 16, generator=g)
    monkeypatch.setattr(ncc, "_SCORES", 500 * 13)
    brute = torch.cdist(features.double(), means.double()).argmin(1)
    assert torch.equal(nearest_class_mean(features, means.double()), brute)


def test_predictions_given_instead_of_logits_count_the_same_agreement():
    g = torch.Generator().manual_seed(3)
    means, features = torch.randn(5, 4, generator=g), torch.randn(40, 4, generator=g)
    labels, logits = torch.randint(0, 5, (40,), generator=g), torch.randn(40, 5, generator=g)
    from_logits, from_predictions = NearestClassMeanAccuracy(means), NearestClassMeanAccuracy(means)
    from_logits.update(features, labels, logits)
    from_predictions.update(features, labels, predictions=logits.argmax(1))
    assert from_logits.compute() == from_predictions.compute()
    with pytest.raises(Exception, match="logits or its predictions, not both"):
        from_predictions.update(features, labels, logits, predictions=logits.argmax(1))
    with pytest.raises(Exception, match=r"predictions must have shape \(40,\), got \(39,\)"):
        from_predictions.update(features, labels, predictions=logits.argmax(1)[:39])
    with pytest.raises(Exception, match=r"logits must have shape \(40, 5\)"):
        from_predictions.update(features, labels, logits[:, :4])
    assert int(from_predictions.total) == 40  # a refused batch changes no state
