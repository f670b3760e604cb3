"""Robustness evaluations by name, registered like models and methods: ``get_attack(name)`` and
``list_attacks()``. ``kdcollapse robust-eval --attacks a,b`` runs each named evaluation; adding one is a
registered function here plus its test."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor

from kdcollapse._registry import Registry
from kdcollapse.adversarial._common import Model
from kdcollapse.adversarial._evaluate import (
    RobustEvaluation,
    autoattack_chain,
    autoattack_standard,
    evaluate_attacks,
    pgd_evaluate,
)
from kdcollapse.adversarial._losses import require_classes

STANDARD_BUDGET = {"n_iter": 100, "n_targets": 9, "n_queries": 5000}


@dataclass(frozen=True)
class AttackSetting:
    """What every evaluation takes besides the model and the data."""

    eps: float
    norm: str = "Linf"
    seed: int = 0
    batch_size: int = 500
    progress: bool = True
    pgd_steps: int = 20
    aa_budget: dict[str, int] = field(default_factory=lambda: dict(STANDARD_BUDGET))
    num_classes: int | None = None
    precision: str = "off"  # the search's autocast precision (verdicts are float32)
    channels_last: bool = False  # the search's memory layout

    @property
    def common(self) -> dict:
        return {"norm": self.norm, "eps": self.eps, "batch_size": self.batch_size, "progress": self.progress,
                "precision": self.precision, "channels_last": self.channels_last}


# An evaluation returns (its label, the result, the budget it ran with).
Evaluation = Callable[[Model, Tensor, Tensor, AttackSetting], tuple[str, RobustEvaluation, dict]]
_ATTACKS: Registry[Evaluation] = Registry("attack")
register_attack = _ATTACKS.register
get_attack = _ATTACKS.get


def list_attacks(pattern: str = "*") -> list[str]:
    return _ATTACKS.names(pattern)


@register_attack("standard")
def standard(model: Model, x: Tensor, y: Tensor, s: AttackSetting) -> tuple[str, RobustEvaluation, dict]:
    """AutoAttack standard; with a reduced ``aa_budget``, the same chain named ``autoattack-reduced``."""
    if s.aa_budget == STANDARD_BUDGET:
        return "autoattack-standard", autoattack_standard(model, x, y, seed=s.seed, **s.common), s.aa_budget
    if s.num_classes is not None:
        require_classes(s.num_classes, 4, "AutoAttack (its APGD-T)")
    chain = autoattack_chain(s.norm, s.eps, **s.aa_budget,
                             generator=torch.Generator(device=x.device).manual_seed(s.seed))
    return "autoattack-reduced", evaluate_attacks(model, x, y, chain, **s.common), s.aa_budget


@register_attack("pgd")
def pgd(model: Model, x: Tensor, y: Tensor, s: AttackSetting) -> tuple[str, RobustEvaluation, dict]:
    """PGD-k with cross-entropy and a random start (``pgd_steps`` steps)."""
    result = pgd_evaluate(model, x, y, steps=s.pgd_steps, seed=s.seed, **s.common)
    return f"pgd-{s.pgd_steps}", result, {"steps": s.pgd_steps}
