"""The loss catalogue: every exported loss is declared, and each declaration tells the truth."""

import inspect

import pytest
import torch

import kdcollapse.losses as L
from kdcollapse.errors import KdcollapseError
from loss_cases import LOGIT_KINDS, takes
from pathlib import Path

# Exported functions that are not losses (helpers around them).
HELPERS = {"loss_module", "validation", "slice_vocab", "shift_for_causal_lm",
           "register_loss", "get_loss", "list_losses", "standardize_logits", "class_table", "example_tensors",
           "crd_log_scores", "crd_normalizer", "crd_memory_update", "vid_initial_log_scale", "match_spatial_size",
           "attention_map", "ofd_margin", "pearson_correlation"}
DOCS = (Path(__file__).parents[1] / "docs" / "losses.md").read_text()


def test_every_exported_loss_function_is_declared():
    declared = {info.function for info in L.list_losses()}
    exported = [getattr(L, name) for name in L.__all__]
    functions = [f for f in exported if inspect.isfunction(f) and f.__name__ not in HELPERS]
    missing = [f.__name__ for f in functions if f not in declared]
    assert not missing, f"declare these losses with @register_loss: {missing}"
    wrapped = [cls.loss_fn for cls in exported
               if inspect.isclass(cls) and issubclass(cls, L.LossModule) and cls is not L.LossModule]
    assert all(fn in declared for fn in wrapped)
    assert {info.function for info in L.list_losses()} <= set(exported)  # declared ones are exported


@pytest.mark.parametrize("info", L.list_losses(), ids=lambda info: info.name)
def test_declaration_matches_the_signature_and_the_docs(info):
    assert info is L.get_loss(info.name) and info.kind in L.KINDS
    assert info.temperature == takes(info, "temperature")
    assert info.ignore_index == takes(info, "ignore_index")
    assert info.chunked == takes(info, "chunk_size")
    assert info.sequences == takes(info, "mask")
    assert info.paper and info.equation
    assert f"`{info.function.__name__}" in DOCS, f"document {info.function.__name__} in docs/losses.md"
    if info.kind in LOGIT_KINDS:
        assert info.cases and info.inputs is None
        y = torch.zeros(2, dtype=torch.long)
        assert info.call(torch.randn(2, 4), torch.randn(2, 4), y, case=info.cases[-1]).dim() == 0
    else:
        assert not info.cases and info.function(*info.inputs()).dim() == 0


@pytest.mark.parametrize("info", [i for i in L.list_losses() if i.temperature], ids=lambda i: i.name)
def test_declared_temperature_is_checked(info):
    with pytest.raises(KdcollapseError, match="temperature must be > 0"):
        if info.kind in LOGIT_KINDS:
            info.call(torch.randn(2, 4), torch.randn(2, 4), torch.zeros(2, dtype=torch.long),
                      temperature=0.0)
        else:
            info.function(*info.inputs(), temperature=0.0)


def test_lookups_and_bad_declarations():
    labelled = [i.name for i in L.list_losses("logits+target")]  # the kind filter, in name order
    assert labelled == sorted(i.name for i in L.list_losses() if i.kind == "logits+target")
    assert {"dkd", "trades"} <= set(labelled) and "kd" not in labelled
    assert L.get_loss("kd").function is L.kd_loss
    with pytest.raises(KdcollapseError, match="unknown loss 'kld'.*kd"):
        L.get_loss("kld")
    with pytest.raises(KdcollapseError, match="loss kind 'logit'"):
        L.list_losses("logit")
    with pytest.raises(KdcollapseError, match="needs example= and no inputs="):
        L.register_loss("x", kind="logits", paper="p", equation="e", temperature=False,
                        sequences=False, ignore_index=False, chunked=False)
    with pytest.raises(KdcollapseError, match="loss 'kd' is registered twice"):
        L.register_loss("kd", kind="features", paper="p", equation="e", temperature=False,
                        sequences=False, ignore_index=False, chunked=False,
                        inputs=lambda: ())(lambda: None)
