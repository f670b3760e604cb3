"""The extension guides run: the python examples of docs/ARCHITECTURE.md ("Adding a loss", "Adding a
method") and docs/models.md ("Adding a model") are executed as written, in scratch copies of the registries,
and each new entry goes through its registry's contract: the loss against its declared reference, the method
against its declared equality, the model through the model and feature-seam tests."""

from __future__ import annotations

import contextlib
import re
import sys
import types
from pathlib import Path

import pytest
import torch

import test_feature_seam
import test_models
from kdcollapse.losses import get_loss
from kdcollapse.losses._catalog import _LOSSES
from kdcollapse.methods import _METHODS
from kdcollapse.models import _MODELS, create_model, model_info
from method_equalities import equality_failures
from test_loss_references import reference_failures

DOCS = Path(__file__).resolve().parents[1] / "docs"


def python_blocks(page: str, heading: str) -> list[str]:
    """The ```python blocks of the section ``heading`` (a "## " line) of docs/``page``."""
    text = (DOCS / page).read_text()
    start = text.index(f"\n## {heading}\n")
    end = text.find("\n## ", start + 1)
    section = text[start:end if end >= 0 else None]
    return re.findall(r"```python\n(.*?)```", section, flags=re.S)


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
