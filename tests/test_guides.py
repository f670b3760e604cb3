"""The extension guides run: the python examples of docs/ARCHITECTURE.md ("Adding a loss", "Adding a
method", "Adding a token divergence", "Adding a metric") and docs/models.md ("Adding a model") are executed as
written, in scratch copies of the registries, and each new entry goes through its registry's contract: the
loss against its declared reference, the method against its declared equality, the model through the model
and feature-seam tests, the metric against its reference streamed and merged, and its catalogue line and docs
row as the metric catalogue's test reads them."""

from __future__ import annotations

import contextlib
import re
import sys
import types
import typing
from pathlib import Path

import pytest
import torch

import kdcollapse.metrics
import test_feature_seam
import test_models
from kdcollapse.losses import get_loss
from kdcollapse.losses._catalog import _LOSSES
from kdcollapse.methods import _METHODS
from kdcollapse.metrics._catalog import METRICS, Source
from kdcollapse.models import _MODELS, create_model, model_info
from method_equalities import equality_failures
from test_loss_references import reference_failures
from test_metrics_catalog import docs_tables

DOCS = Path(__file__).resolve().parents[1] / "docs"


def python_blocks(page: str, heading: str, language: str = "python") -> list[str]:
    """The ```python (or ``language``) blocks of the section ``heading`` (a "## " line) of docs/``page``."""
    text = (DOCS / page).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else None]
    return re.findall(rf"```{language}\n(.*?)```", section, flags=re.S)


@contextlib.contextmanager
def scratch_registries():
    with _LOSSES.scratch(), _METHODS.scratch(), _MODELS.scratch():
        yield


def run(blocks: list[str]) -> types.ModuleType:
    """The blocks executed, in order, as the body of one module (as a user's ``--import`` module)."""
    module = types.ModuleType("kdcollapse_guide_example")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    try:
        for block in blocks:
            exec(compile(block, module.__name__, "exec"), module.__dict__)
    finally:
        del sys.modules[module.__name__]
    return module


def test_the_guides_have_their_examples():
    assert len(python_blocks("ARCHITECTURE.md", "Adding a loss")) == 1
    assert len(python_blocks("ARCHITECTURE.md", "Adding a method")) == 1
    assert len(python_blocks("models.md", "Adding a model")) == 1
    assert len(python_blocks("ARCHITECTURE.md", "Adding a token divergence")) == 1
    assert len(python_blocks("ARCHITECTURE.md", "Adding a metric")) == 1
    assert len(python_blocks("ARCHITECTURE.md", "Adding a metric", "markdown")) == 1


def test_the_loss_and_method_guides_pass_their_contracts():
    with scratch_registries():
        run(python_blocks("ARCHITECTURE.md", "Adding a loss") + python_blocks("ARCHITECTURE.md", "Adding a method"))
        info = get_loss("cosine_hint")
        assert reference_failures(info) == []
        assert equality_failures("hint") == []


def test_the_divergence_guide_passes_its_reference_and_reaches_the_lm_paths():
    from kdcollapse.losses.llm import token_divergence

    with scratch_registries():
        module = run(python_blocks("ARCHITECTURE.md", "Adding a token divergence"))
        assert reference_failures(get_loss("my_kl")) == []
        g = torch.Generator().manual_seed(0)
        s, t = torch.randn(2, 3, 5, generator=g, dtype=torch.float64).unbind()
        assert torch.allclose(token_divergence(s, t, "my_kl", lam=0.3), module.my_kl_loss(s, t, lam=0.3))
        assert torch.allclose(module.my_kl_loss(s, t, lam=0.0), module.my_kl_reference(s, t, lam=0.0))


def test_the_model_guide_passes_the_model_contracts():
    with scratch_registries():
        run(python_blocks("models.md", "Adding a model"))
        info = model_info("tinynet")
        assert len(create_model("tinynet", 10).feature_info) >= info.min_stages
        try:
            test_models.test_seam_forward_backward("tinynet")
            test_models.test_reset_classifier("tinynet")
            test_feature_seam.test_forward_intermediates_match_feature_info_in_every_mode("tinynet")
        finally:
            test_models._model.cache_clear()
            test_feature_seam.model.cache_clear()


def metric_failures(module: types.ModuleType) -> list[str]:
    """What the metric guide's ``EffectiveRank`` gets wrong against ``rankme_reference`` and the closed forms of
    its docstring: accumulated over uneven batches, two metrics' states merged (what a sync across processes
    computes: its states are sums), one batch through ``forward``."""
    g = torch.Generator().manual_seed(0)
    mixing = torch.randn(6, 6, generator=g, dtype=torch.float64)
    batches = [torch.randn(n, 6, generator=g, dtype=torch.float64) @ mixing for n in (7, 2, 9)]
    failures = []

    def check(what, metric, expected):
        value = metric.compute()["rankme"] if isinstance(metric, kdcollapse.metrics.Metric) else metric["rankme"]
        if not torch.allclose(value, torch.as_tensor(expected, dtype=torch.float64), rtol=1e-9, atol=1e-9):
            failures.append(f"{what}: {float(value)} != {float(expected)}")

    whole = module.rankme_reference(torch.cat(batches))
    streamed = module.EffectiveRank(6)
    for batch in batches:
        streamed.update(batch)
    check("streamed", streamed, whole)
    first, rest = module.EffectiveRank(6), module.EffectiveRank(6)
    first.update(batches[0])
    for batch in batches[1:]:
        rest.update(batch)
    first.merge_state(rest)
    check("merged", first, whole)
    check("forward", module.EffectiveRank(6)(batches[1]), module.rankme_reference(batches[1]))
    equal = module.EffectiveRank(6)
    equal.update(3 * torch.linalg.qr(mixing).Q)  # six equal singular values
    check("d equal singular values", equal, 6.0)
    line = module.EffectiveRank(6)
    line.update(torch.randn(20, 1, generator=g, dtype=torch.float64) * mixing[0])  # every feature on one line
    check("one direction", line, 1.0)
    return failures


def test_the_metric_guide_passes_its_reference_and_its_catalogue_line_and_row_fit():
    module = run(python_blocks("ARCHITECTURE.md", "Adding a metric"))
    assert metric_failures(module) == []
    info = module.RANKME
    assert isinstance(info, kdcollapse.metrics.MetricInfo) and info.name not in {m.name for m in METRICS}
    assert info.meaning and "\n" not in info.meaning and info.paper
    assert {info.name} == set(module.EffectiveRank.KEYS) == set(module.EffectiveRank(2)(torch.eye(2)))
    # a catalogue source is what returns the key, a name on kdcollapse.metrics' face: the new class's own name
    assert info.source == module.EffectiveRank.__name__
    assert all(hasattr(kdcollapse.metrics, source) for source in typing.get_args(Source))
    (row,) = python_blocks("ARCHITECTURE.md", "Adding a metric", "markdown")
    assert docs_tables(row) == {info.name: info.paper}  # the row as test_metrics_catalog reads docs/metrics.md


def test_a_metric_guide_example_with_a_wrong_formula_fails_its_check():
    """The check above can fail: the guide's metric on the eigenvalues of ZᵀZ (σ²) instead of σ."""
    (block,) = python_blocks("ARCHITECTURE.md", "Adding a metric")
    assert ".sqrt()" in block
    assert metric_failures(run([block.replace(".sqrt()", "")]))


def test_a_guide_example_that_breaks_a_contract_fails_it():
    """The check above can fail: the method guide with its regressor skipped in ``forward``."""
    blocks = python_blocks("ARCHITECTURE.md", "Adding a method")
    assert "cosine_hint_loss(self.regressor(f_s), f_t)" in blocks[0]
    broken = blocks[0].replace("cosine_hint_loss(self.regressor(f_s), f_t)", "cosine_hint_loss(f_s, f_t)")
    with scratch_registries():
        run(python_blocks("ARCHITECTURE.md", "Adding a loss") + [broken])
        assert equality_failures("hint")


@pytest.mark.parametrize("name", ["cosine_hint", "hint", "tinynet"])
def test_the_guides_leave_no_entry_behind(name):
    assert name not in _LOSSES and name not in _METHODS and name not in _MODELS
