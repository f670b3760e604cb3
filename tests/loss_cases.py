"""Parametrisation of the loss contract tests over the loss catalogue (kdcollapse.losses.list_losses)."""

import inspect

import pytest
import torch

import kdcollapse.losses as L

LOGIT_KINDS = ("logits", "logits+target")


def case_id(info, case):
    return info.name + (f"[{case.label}]" if case.label else "")


def logit_cases(where=lambda info, case: True):
    """pytest params (info, case): every call case of every declared logit loss that ``where`` keeps."""
    return [pytest.param(info, case, id=case_id(info, case))
            for info in L.list_losses(LOGIT_KINDS) for case in info.cases if where(info, case)]


def other_losses(where=lambda info: True):
    """pytest params: every declared loss that is not a logit loss (features, tokens)."""
    return [pytest.param(info, id=info.name) for info in L.list_losses(("features", "tokens"))
            if where(info)]


def labelled(case, k=3):
    """Whether the case passes labels (so positions labelled ignore_index are dropped)."""
    return "target" in case.arguments(k, torch.zeros(1, dtype=torch.long))


def takes(info, option):
    return option in inspect.signature(info.function).parameters
