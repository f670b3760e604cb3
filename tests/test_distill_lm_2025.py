"""distill-lm with the 2025 token divergences (AKL, ABKD), their parameters as loss.<name> keys: two steps
each on the tiny setup of tests/test_distill_lm.py, and a parameter out of range refused at config time."""

import pytest
import torch

from kdcollapse.errors import KdcollapseError
from kdcollapse.train import distill_lm, load_lm_config

pytest.importorskip("transformers")
from test_distill_lm import setup  # noqa: E402,F401  (the fixture: a tiny teacher, corpus and student)


@pytest.mark.parametrize("overrides", [["loss.divergence=akl", "loss.mu=0.3"],
                                       ["loss.divergence=abkd", "loss.alpha=0.2", "loss.beta=0.7"],
                                       ["loss.divergence=distillm2_student_kl", "loss.alpha=0.1"]])
def test_distill_lm_trains_with_the_2025_divergences(setup, overrides):  # noqa: F811
    root, options = setup
    cfg = load_lm_config(None, [*options, f"run_dir={root / overrides[0].split('=')[1]}", "steps=2", *overrides])
    record = distill_lm(cfg, log=lambda *_: None)
    assert record["step"] == 2 and torch.isfinite(torch.tensor(record["train_loss"]))


def test_a_parameter_out_of_range_is_refused(setup):  # noqa: F811
    root, options = setup
    with pytest.raises(KdcollapseError, match=r"mu of akl must be a number in \[0, 1\]"):
        load_lm_config(None, [*options, f"run_dir={root / 'bad'}", "loss.divergence=akl", "loss.mu=1.5"])
