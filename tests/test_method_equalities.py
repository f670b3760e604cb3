"""Every registered method computes what its registration declares (``register_method(name, equals=...)``),
in value and gradients, float64; and the check catches wrong methods built here (mutation test, issue 38.3):
no test below is written for a mutant, each is only registered in a scratch copy of the registry and run
through the same :func:`equality_failures` as the package's methods."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kdcollapse.losses import get_loss
from kdcollapse.methods import _METHODS, get_method, list_methods, register_method
from kdcollapse.methods.fitnet import FitNet
from kdcollapse.methods.kd import KD
from method_equalities import equality_failures

PACKAGE = [n for n in list_methods() if get_method(n).__module__.startswith("kdcollapse.methods.")]


@pytest.mark.parametrize("name", PACKAGE)
def test_the_method_computes_its_declared_equality(name):
    failures = equality_failures(name)
    assert not failures, "\n".join(failures)


# --- mutants: a right-looking method whose forward is not what it declares --------------------------------

def _ce_plus(distill):
    """CE·ce_weight + kd_weight·distill(z_s, z_t, τ): a KD-style declaration over a registered loss."""
    def equals(m, x, y):
        cfg, logits = m.config, m.student(x)
        return (cfg.ce_weight * m.cross_entropy(logits, y)
                + cfg.kd_weight * distill(logits, m.teacher_logits(x), cfg.temperature))
    return equals


def reverse_kd_computing_forward_kl():
    """Declares τ²·KL(p_s ‖ p_t) (the registered ``reverse_kl``), computes KD's forward KL (inherited)."""
    reverse = get_loss("reverse_kl").function

    @register_method("mutant_reverse_kd", equals=_ce_plus(lambda s, t, tau: tau**2 * reverse(s, t, tau)))
    class ReverseKD(KD):
        pass

    return ReverseKD


def fitnet_skipping_its_regressor():
    """Declares FitNet's CE + hint_weight·fitnet(r(v_s), u_t); forward feeds v_s to the loss unregressed."""
    def equals(m, x, y):
        cfg = m.config
        h, (guided,) = m.student.forward_intermediates(x, [cfg.student_stage])
        (hint,) = m.read_teacher(x).maps
        return (cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y)
                + cfg.hint_weight * get_loss("fitnet").function(m.regressor(guided), hint))

    @register_method("mutant_fitnet", equals=equals)
    class NoRegressor(FitNet):
        def forward(self, x, y):
            cfg = self.config
            h, (guided,) = self.student.forward_intermediates(x, [cfg.student_stage])
            logits = self.student.forward_head(h)
            (hint,) = self.read_teacher(x).maps
            hint_loss = cfg.hint_weight * get_loss("fitnet").function(guided, hint)
            return {"loss": self.cross_entropy(logits, y) + hint_loss, "logits": logits}

    return NoRegressor


def hint_with_sum_reduction():
    """FitNet's own declaration; forward sums the squared error instead of FitNets' mean."""
    @register_method("mutant_fitnet_sum", equals=get_method("fitnet").equals)
    class SumHint(FitNet):
        def forward(self, x, y):
            cfg = self.config
            h, (guided,) = self.student.forward_intermediates(x, [cfg.student_stage])
            logits = self.student.forward_head(h)
            (hint,) = self.read_teacher(x).maps
            hint_loss = cfg.hint_weight * (self.regressor(guided) - hint).pow(2).sum()
            return {"loss": cfg.ce_weight * self.cross_entropy(logits, y) + hint_loss, "logits": logits}

    return SumHint


def undeclared():
    """A method registered without ``equals``: refused with what to declare."""
    @register_method("mutant_undeclared")
    class Undeclared(KD):
        pass

    return Undeclared


@dataclass
class Mutant:
    build: object
    message: str  # what the failure says


MUTANTS = [
    pytest.param(Mutant(reverse_kd_computing_forward_kl, "loss .* its declared equality"), id="reverse_kd"),
    pytest.param(Mutant(fitnet_skipping_its_regressor, "loss .* its declared equality"), id="fitnet_no_regressor"),
    pytest.param(Mutant(hint_with_sum_reduction, "loss .* its declared equality"), id="fitnet_sum_hint"),
    pytest.param(Mutant(undeclared, "declares no equality: register it with register_method"), id="undeclared"),
]


@pytest.mark.parametrize("mutant", MUTANTS)
def test_the_contract_catches_the_mutant(mutant):
    import re

    with _METHODS.scratch():
        cls = mutant.build()
        failures = equality_failures(cls.name)
    assert cls.name not in list_methods()  # the scratch registry is gone
    assert failures and any(re.search(mutant.message, f) for f in failures), failures
