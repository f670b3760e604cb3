"""Every declared loss equals its declared reference (``register_loss(..., reference=...)``): value and the
fitted side's gradient, float64, random inputs, every call case; and the check catches wrong losses built
here (mutation test, issue 38.3) with no test written for them.

The losses below without a reference yet are listed in PENDING; the test fails when one of them gains a
reference (remove it from the list) and when a loss outside the list has none, so the list only shrinks.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect

import pytest
import torch

import kdcollapse.losses as L
from kdcollapse.losses._catalog import _LOSSES
from kdcollapse.losses._divergence import divergence_loss
from kdcollapse.losses.llm import _skew_reverse_kl as _skew_reverse_rows

RTOL, ATOL = 1e-9, 1e-12
B, K = 6, 7
# Declared before references were asked of a loss, not yet given one: none left (the token divergences' loop
# references are in kdcollapse/losses/_token_references.py). A new loss without one fails below.
PENDING: set[str] = set()


def _logit_calls(info):
    """(label, call(function) -> loss, the fitted-side tensor) for each case, on random (B, K) float64 logits."""
    g = torch.Generator().manual_seed(0)
    for case in info.cases:
        student = (3 * torch.randn(B, K, generator=g, dtype=torch.float64)).requires_grad_()
        teacher = 3 * torch.randn(B, K, generator=g, dtype=torch.float64)
        target = torch.randint(0, K, (B,), generator=g)
        pair, arguments = info.arguments(student, teacher, target, case)
        yield case.label, (lambda f, pair=pair, arguments=arguments: f(*pair, **arguments)), student


def _feature_calls(info):
    inputs = [t.clone().requires_grad_() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
              for t in info.inputs()]  # a teacher may be a container (fused_head's TeacherLogits)
    yield "", (lambda f: f(*inputs)), inputs[0]


def reference_failures(info) -> list[str]:
    """What is wrong with loss ``info`` against its declared reference: [] when value and the gradient of the
    fitted side (the student logits, or the first input) agree in float64 for every case."""
    if info.reference is None:
        return [f"loss {info.name!r} declares no reference: register it with register_loss(..., reference=f), "
                "f a slow, independent implementation of the paper's definition taking the same arguments"]
    failures = []
    calls = _logit_calls(info) if info.kind in ("logits", "logits+target") else _feature_calls(info)
    for label, call, fitted in calls:
        where = f"loss {info.name!r}" + (f" [{label}]" if label else "")
        value, expected = call(info.function), call(info.reference)
        if not torch.allclose(value, expected, rtol=RTOL, atol=ATOL):
            failures.append(f"{where}: {value.item():.12g}, its reference {expected.item():.12g}")
            continue
        (grad,) = torch.autograd.grad(value, fitted)
        (want,) = torch.autograd.grad(expected, fitted)
        if not torch.allclose(grad, want, rtol=RTOL, atol=ATOL):
            failures.append(f"{where}: the gradient differs from its reference's by {(grad - want).abs().max():.3g}")
    return failures


@pytest.mark.parametrize("info", [i for i in L.list_losses() if i.name not in PENDING], ids=lambda i: i.name)
def test_the_loss_equals_its_declared_reference(info):
    failures = reference_failures(info)
    assert not failures, "\n".join(failures)


def test_pending_only_shrinks():
    names = {i.name for i in L.list_losses()}
    assert PENDING <= names, f"not declared any more, drop from PENDING: {PENDING - names}"
    given = {n for n in PENDING if L.get_loss(n).reference is not None}
    assert not given, f"these now declare a reference, drop them from PENDING: {given}"


# --- mutants: a right-looking loss that computes something else than its reference -----------------------

def swap_sides(function):
    """The two logit (or feature) tensors exchanged: forward KL becomes reverse KL, student becomes teacher."""
    return lambda a, b, *args, **kwargs: function(b, a, *args, **kwargs)


def swap_arguments(first: str, second: str):
    """Two named weights exchanged (DKD's α and β; AKL's head and tail are the same mutation)."""
    def mutate(function):
        defaults = {k: p.default for k, p in inspect.signature(function).parameters.items()}

        def mutant(*args, **kwargs):
            bound = inspect.signature(function).bind(*args, **kwargs)
            bound.apply_defaults()
            values = bound.arguments
            values[first], values[second] = values[second], values[first]
            return function(*bound.args, **bound.kwargs)

        assert first in defaults and second in defaults
        return mutant
    return mutate


def patched(target: str, wrap):
    """The loss run with the helper ``target`` (``module.name``) replaced by ``wrap(helper)``: a mutation inside
    the code the loss calls (AKL's head and tail weights, IKL's two weights)."""
    module_name, attr = target.rsplit(".", 1)

    def mutate(function):
        module = importlib.import_module(module_name)
        helper = getattr(module, attr)

        def mutant(*args, **kwargs):
            setattr(module, attr, wrap(helper))
            try:
                return function(*args, **kwargs)
            finally:
                setattr(module, attr, helper)
        return mutant
    return mutate


def swapped_outputs(helper):
    """A helper returning its two results the other way round (AKL: head weight ↔ tail weight)."""
    return lambda *args, **kwargs: tuple(reversed(helper(*args, **kwargs)))


def mapped_argument(name: str, change):
    """The named argument ``name`` (given or its default) replaced by ``change(value)`` (jsd's β ↔ 1 − β)."""
    def mutate(function):
        signature = inspect.signature(function)
        assert name in signature.parameters

        def mutant(*args, **kwargs):
            bound = signature.bind(*args, **kwargs)
            bound.apply_defaults()
            bound.arguments[name] = change(bound.arguments[name])
            return function(*bound.args, **bound.kwargs)
        return mutant
    return mutate


def keyword(**wrong):
    """The loss called with keyword arguments it was not asked for (fused_head on another divergence)."""
    return lambda function: lambda *args, **kwargs: function(*args, **{**kwargs, **wrong})


def divergence_rows(name: str, change):
    """Token divergence ``name`` regenerated from another per-row formula ``change(its rows)``, by the same
    generation as its declaration: a mutation of the one formula every LM path reads (tvd without its ½)."""
    def mutate(function):
        declared = L.get_loss(name).divergence
        return divergence_loss(name, dataclasses.replace(declared, rows=change(declared.rows)))
    return mutate


def summed(function):
    """The mean over entries replaced by their sum (the wrong normalisation)."""
    return lambda *args, **kwargs: function(*args, **kwargs) * args[0].numel()


LOSS_MUTANTS = [
    pytest.param("kd", swap_sides, id="kd_as_reverse_kl"),
    pytest.param("dkd", swap_arguments("alpha", "beta"), id="dkd_alpha_beta_swapped"),
    pytest.param("binary_kl", swap_sides, id="binary_kl_sides_swapped"),
    pytest.param("fitnet", summed, id="fitnet_summed"),
    pytest.param("ikl", patched("kdcollapse.losses.dkl._decoupled", lambda f: lambda d, w, s, lp, a, b: f(d, w, s, lp, b, a)),
                 id="ikl_weights_swapped"),
    # the token divergences (issue 38.1-2, 39.5), one family each
    pytest.param("reverse_kl", swap_sides, id="reverse_kl_as_forward_kl"),
    pytest.param("jsd", mapped_argument("beta", lambda beta: 1 - beta), id="jsd_beta_as_one_minus_beta"),
    pytest.param("skew_forward_kl", mapped_argument("alpha", lambda alpha: 1 - alpha), id="skew_kl_alpha_as_one_minus_alpha"),
    pytest.param("tvd", divergence_rows("tvd", lambda rows: lambda log_q, log_p: 2 * rows(log_q, log_p)), id="tvd_without_half"),
    pytest.param("abkd", divergence_rows("abkd", lambda rows: lambda log_q, log_p, alpha, beta: rows(log_q, log_p, beta, alpha)),
                 id="abkd_alpha_beta_swapped"),
    # the official ab_div's α = 0 and β = 0 branches (divided by β, α where the limit divides by β², α²)
    pytest.param("abkd", divergence_rows("abkd", lambda rows: lambda log_q, log_p, alpha, beta: rows(
        log_q, log_p, alpha, beta) * (beta if alpha == 0 and beta != 0 else 1)), id="abkd_alpha_0_as_official"),
    pytest.param("abkd", divergence_rows("abkd", lambda rows: lambda log_q, log_p, alpha, beta: rows(
        log_q, log_p, alpha, beta) * (alpha if beta == 0 and alpha != 0 else 1)), id="abkd_beta_0_as_official"),
    pytest.param("distillm2_student_kl", divergence_rows(  # the same value, another gradient
        "distillm2_student_kl", lambda rows: lambda log_q, log_p, alpha: _skew_reverse_rows(log_q, log_p, alpha)),
        id="distillm2_student_kl_mixture_not_detached"),
    pytest.param("distillm2", mapped_argument("student_response", lambda flags: ~flags), id="distillm2_halves_swapped"),
    pytest.param("fused_head", keyword(divergence="reverse_kl"), id="fused_head_on_reverse_kl"),
    pytest.param("distillm2_fused", mapped_argument("alpha", lambda alpha: 0.0), id="distillm2_fused_without_skew"),
    # AKL (issue 39) with its head and tail weights swapped, once the loss is in the catalogue:
    *([pytest.param("akl", patched("kdcollapse.losses.akl.akl_weights", swapped_outputs), id="akl_head_tail_swapped")]
      if "akl" in _LOSSES else []),
]


@pytest.mark.parametrize(("name", "mutate"), LOSS_MUTANTS)
def test_the_reference_check_catches_the_mutant(name, mutate):
    original = L.get_loss(name)
    with _LOSSES.scratch():
        _LOSSES._entries[f"mutant_{name}"] = dataclasses.replace(original, name=f"mutant_{name}",
                                                                 function=mutate(original.function))
        failures = reference_failures(L.get_loss(f"mutant_{name}"))
    assert f"mutant_{name}" not in {i.name for i in L.list_losses()}
    assert failures and all("its reference" in f or "gradient differs" in f for f in failures), failures


# --- the references' own branches: the limits they take and the options the contract's call leaves unused ----

@pytest.mark.parametrize(("alpha", "beta"), [(0.0, 0.7), (0.4, 0.0), (0.3, -0.3), (0.0, 0.0)])
def test_the_alpha_beta_reference_takes_the_limits_of_its_general_formula(alpha, beta):
    from kdcollapse.losses._token_references import _row_abkd

    g = torch.Generator().manual_seed(1)
    p, q = (torch.softmax(3 * torch.randn(2, K, generator=g, dtype=torch.float64), -1)).unbind()
    near = [_row_abkd(p, q, alpha + e, beta + f) for e, f in ((1e-5, 2e-5), (-2e-5, 1e-5))]
    for value in near:
        assert torch.allclose(value, _row_abkd(p, q, alpha, beta), rtol=1e-3)  # O(1e-5) off the line


@pytest.mark.parametrize("divergence", ["forward_kl", "reverse_kl", "jsd", "skew_forward_kl", "skew_reverse_kl",
                                        "tvd", "abkd", "distillm2_student_kl"])
def test_the_fused_reference_equals_the_fused_loss_with_labels_mask_and_a_teacher_head(divergence):
    from kdcollapse.losses import _token_references as ref
    from kdcollapse.losses.fused import TeacherHead, fused_head_loss

    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(7, 4, generator=g, dtype=torch.float64, requires_grad=True)
    weight = torch.randn(5, 4, generator=g, dtype=torch.float64)
    teacher = TeacherHead(torch.randn(7, 3, generator=g, dtype=torch.float64),
                          torch.randn(6, 3, generator=g, dtype=torch.float64))
    labels = torch.tensor([0, 4, -100, 2, 1, 3, 0])
    mask = torch.tensor([1, 1, 1, 0, 1, 1, 1])
    parameters = {"jsd": {"beta": 0.3}, "abkd": {"alpha": 0.5, "beta": 0.2}}.get(divergence, {})
    options = dict(labels=labels, ce_weight=0.5, distill_weight=0.7, mask=mask, chunk_size=3, **parameters)
    value = fused_head_loss(hidden, weight, teacher, divergence, 2.0, **options)
    expected = ref.fused_head(hidden, weight, teacher, divergence, 2.0, **options)
    assert torch.allclose(value, expected, rtol=RTOL, atol=ATOL)
    (grad,), (want,) = torch.autograd.grad(value, hidden), torch.autograd.grad(expected, hidden)
    assert torch.allclose(grad, want, rtol=RTOL, atol=ATOL)
