"""distill-lm with the 2025 token divergences (AKL, ABKD, DistiLLM-2), their parameters as loss.<name> keys: two
steps each on the tiny setup of tests/test_distill_lm.py, a parameter out of range refused at config time, and
DistiLLM-2's objective on the teacher's and the student's responses to the same prompts against the loss on
full logits."""

import pytest
import torch

from kdcollapse.errors import KdcollapseError
from kdcollapse.train import distill_lm, load_lm_config

pytest.importorskip("transformers")
from test_distill_lm import setup  # noqa: E402,F401  (the fixture: a tiny teacher, corpus and student)


@pytest.mark.parametrize("overrides", [["loss.divergence=akl", "loss.mu=0.3"],
                                       ["loss.divergence=abkd", "loss.alpha=0.2", "loss.beta=0.7"],
                                       ["loss.divergence=distillm2_student_kl", "loss.alpha=0.1"],
                                       ["loss.divergence=distillm2", "loss.alpha=0.2", "generation.seq_kd=true",
                                        "generation.lmbda=0.5", "teacher_k=null", "loss.ce_weight=0.3"]])
def test_distill_lm_trains_with_the_2025_divergences(setup, overrides):  # noqa: F811
    root, options = setup
    cfg = load_lm_config(None, [*options, f"run_dir={root / overrides[0].split('=')[1]}", "steps=2", *overrides])
    record = distill_lm(cfg, log=lambda *_: None)
    assert record["step"] == 2 and torch.isfinite(torch.tensor(record["train_loss"]))


def test_a_parameter_out_of_range_is_refused(setup):  # noqa: F811
    root, options = setup
    with pytest.raises(KdcollapseError, match=r"mu of akl must be a number in \[0, 1\]"):
        load_lm_config(None, [*options, f"run_dir={root / 'bad'}", "loss.divergence=akl", "loss.mu=1.5"])


def test_distillm2_scores_teacher_and_student_responses_to_the_same_prompts(setup):  # noqa: F811
    """loss.divergence=distillm2 (seq_kd, lmbda 0.5): the first half of a micro-batch is the teacher's completions
    of its prompts, the second the student's completions of the same prompts; the fused loss equals
    ``distillm2_loss`` (reduction "mean") on the full logits of both at the completion positions, plus
    ce_weight × CE on the teacher's responses."""
    import torch.nn.functional as F

    from kdcollapse import lm
    from kdcollapse.losses import distillm2_loss
    from kdcollapse.train._lm_task import _loss, _Teacher

    root, options = setup
    cfg = load_lm_config(None, [*options, "run_dir=unused", "loss.divergence=distillm2", "loss.alpha=0.2",
                                "generation.seq_kd=true", "generation.lmbda=0.5", "teacher_k=null",
                                "loss.temperature=1.5", "loss.ce_weight=0.4"])
    teacher = _Teacher(str(root / "teacher"))
    student = lm.load_language_model(root / "teacher").model
    student.model.layers[0].mlp.down_proj.weight.data.mul_(0.5)
    train = torch.randint(0, 300, (6, 8), generator=torch.Generator().manual_seed(0))
    micro = torch.tensor([1, 4, 2, 0])
    got = _loss(cfg, student, teacher, train, None, micro, torch.Generator().manual_seed(7), eos=None)
    g = torch.Generator().manual_seed(7)
    prompts = train[micro[:2], :4]
    by_teacher = lm.sample_completions(teacher.model, prompts, 4, temperature=0.9, generator=g, vocab_size=300)
    by_student = lm.sample_completions(student, prompts, 4, temperature=0.9, generator=g, vocab_size=300)
    ids = torch.cat([by_teacher.sequences, by_student.sequences])
    with torch.no_grad():
        q, p = student(ids).logits[:, 3:-1], teacher.model(ids).logits[:, 3:-1]
        flags = torch.tensor([False, False, True, True])
        want = distillm2_loss(q, p, flags, alpha=0.2, temperature=1.5)
        ce = F.cross_entropy(q[:2].reshape(-1, 300), ids[:2, 4:].reshape(-1), reduction="sum")
        want = (want * 16 + 0.4 * ce) / 16  # every position is a completion position (no end of text here)
    torch.testing.assert_close(got.detach(), want.to(got.dtype), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("bad", [["generation.lmbda=0.5"], ["generation.seq_kd=true"],
                                 ["generation.seq_kd=true", "generation.lmbda=0.25"]])
def test_distillm2_needs_both_halves(setup, bad):  # noqa: F811
    root, options = setup
    with pytest.raises(KdcollapseError, match="generation.seq_kd=true and generation.lmbda=0.5"):
        load_lm_config(None, [*options, "run_dir=unused", "loss.divergence=distillm2", "teacher_k=null", *bad])
