"""Contract of the attack registry: every registered evaluation, on a tiny linear model with a reduced
budget, returns (label, RobustEvaluation, budget) with adversarial examples inside the threat model."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from kdcollapse.adversarial import AttackSetting, RobustEvaluation, get_attack, list_attacks
from kdcollapse.adversarial._common import in_threat_model
from kdcollapse.errors import KdcollapseError

K = 5
REDUCED = {"n_iter": 3, "n_targets": 2, "n_queries": 20}


def _task():
    g = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, K))
    with torch.no_grad():
        model[1].weight.copy_(torch.randn(K, 16, generator=g))
        model[1].bias.zero_()
    x = torch.rand(12, 1, 4, 4, generator=g)
    with torch.no_grad():
        y = model(x).argmax(1)  # every point starts correctly classified
    y[:2] = (y[:2] + 1) % K  # ... except two
    return model, x, y


def test_the_registry_lists_the_evaluations():
    assert {"standard", "pgd"} <= set(list_attacks())
    with pytest.raises(KdcollapseError, match="unknown attack 'pgdd'.*Valid choices: .*pgd"):
        get_attack("pgdd")


@pytest.mark.parametrize("norm, eps", [("Linf", 0.05), ("L2", 0.3)])
@pytest.mark.parametrize("name", list_attacks())
def test_every_attack_returns_label_result_and_budget(name, norm, eps):
    model, x, y = _task()
    setting = AttackSetting(eps=eps, norm=norm, progress=False, pgd_steps=3, aa_budget=dict(REDUCED),
                            num_classes=K, batch_size=5)
    label, result, budget = get_attack(name)(model, x, y, setting)
    assert isinstance(label, str) and label and isinstance(budget, dict) and budget
    assert isinstance(result, RobustEvaluation)
    assert (result.norm, result.eps, len(result.robust)) == (norm, eps, len(y))
    assert in_threat_model(result.x_adv, x, norm, eps).all()
    with torch.no_grad():
        correct = model(result.x_adv).argmax(1) == y
    assert torch.equal(result.robust, correct)  # robust = still classified correctly on x_adv
    assert result.clean_accuracy == pytest.approx(10 / 12)
    assert result.robust_accuracy == pytest.approx(correct.float().mean().item())
    assert result.robust_accuracy <= result.clean_accuracy
    assert not result.robust[:2].any()  # a misclassified point is never counted robust
