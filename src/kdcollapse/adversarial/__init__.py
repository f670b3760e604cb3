"""Adversarial attacks and robustness evaluation.

Our own implementations of the published algorithms: PGD (Madry et al. 2018) and the TRADES inner
maximisation (Zhang et al. 2019), APGD and APGD-T (Croce & Hein 2020), FAB-T (Croce & Hein 2020), the
Square attack (Andriushchenko et al. 2020), and the AutoAttack "standard" evaluation chaining the last
three; ``evaluate_run`` evaluates a trained run (behind ``kdcollapse robust-eval``). Every attack works
on [0, 1] inputs (normalise inside the model, e.g. with :class:`Normalized`), stays in the ε-ball ∩
[0, 1] box, runs the model in eval mode and leaves parameter gradients untouched.
"""

from kdcollapse.adversarial._apgd import apgd_attack, apgd_checkpoints, apgd_targeted_attack
from kdcollapse.adversarial._common import (NORMS, Normalized, SearchModel, check_count, lp_norm, parse_eps,
                                          search_model)
from kdcollapse.adversarial._evaluate import (
    AttackStage,
    RobustEvaluation,
    autoattack_chain,
    autoattack_standard,
    evaluate_attacks,
    pgd_evaluate,
)
from kdcollapse.adversarial._fab import fab_attack, project_onto_hyperplane_in_box
from kdcollapse.adversarial._losses import dlr_loss, dlr_targeted_loss, margin
from kdcollapse.adversarial._pgd import pgd_attack, trades_attack
from kdcollapse.adversarial._registry import STANDARD_BUDGET, AttackSetting, get_attack, list_attacks, register_attack
from kdcollapse.adversarial._square import square_attack, square_p_schedule

__all__ = [
    "NORMS",
    "STANDARD_BUDGET",
    "AttackSetting",
    "AttackStage",
    "Normalized",
    "SearchModel",
    "RobustEvaluation",
    "apgd_attack",
    "apgd_checkpoints",
    "apgd_targeted_attack",
    "autoattack_chain",
    "autoattack_standard",
    "check_count",
    "dlr_loss",
    "dlr_targeted_loss",
    "evaluate_attacks",
    "fab_attack",
    "get_attack",
    "list_attacks",
    "lp_norm",
    "margin",
    "parse_eps",
    "pgd_attack",
    "pgd_evaluate",
    "project_onto_hyperplane_in_box",
    "register_attack",
    "search_model",
    "square_attack",
    "square_p_schedule",
    "trades_attack",
]
