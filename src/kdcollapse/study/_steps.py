"""Registered post steps: measurements of a run's last saved model that no ``kdcollapse`` command writes. A
study names one as ``post: [{step: NAME, creates: FILE.json}]``; the executor writes the mapping it returns to
``FILE.json`` in the run directory, and the summary may read its numbers as last-epoch metrics."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from kdcollapse.data import make_loader
from kdcollapse.runs import Run


@torch.no_grad()
def max_logit(run_dir: Path) -> dict:
    """``{"max_logit": m}``: the largest logit of the run's last saved model on its validation split (its test
    split without one), in eval mode. The official BinaryKL form is inf/NaN once a logit passes 24·ln 2·τ."""
    run = Run(run_dir)
    split = "val" if run.config.data.val_per_class > 0 else "test"
    model, _ = run.model()
    model.eval()
    loader = make_loader(run.dataset(split), 500, train=False, device="cpu", seed=0)
    return {"max_logit": max(float(model(x).max()) for x, _ in loader)}


STEPS: dict[str, Callable[[Path], dict]] = {"max_logit": max_logit}
