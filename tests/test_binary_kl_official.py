"""``form="official"`` of BinaryKL and BinaryKL-Norm: the official clamped expression, bit for bit in
float32, equal to the stable form where no clamp binds, and inf/NaN where the float32 clamp fails."""

import math

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.config import load_config, method_config
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.losses import binary_kl_loss, binary_kl_norm_loss
from kdcollapse.methods import FrozenTeacher, build_method
from kdcollapse.models import create_model
from kdcollapse.train import TrainingDiverged, fit
from kdcollapse.runs import load_tensors
from kdcollapse.runs._checkpoint import save_tensors


def official_binary_kl(student, teacher, temperature):
    """DHKD eq. 1 as the official code states it: σ clamped to [1e-8, 1 − 1e-8], KL summed
    over every entry through KLDivLoss(reduction="none"), times τ², divided by the batch size."""
    q_s = torch.clamp(torch.sigmoid(student / temperature), min=1e-8, max=1 - 1e-8)
    q_t = torch.clamp(torch.sigmoid(teacher / temperature), min=1e-8, max=1 - 1e-8)
    loss = F.kl_div(torch.log(q_s), q_t, reduction="none") + F.kl_div(torch.log(1 - q_s), 1 - q_t, reduction="none")
    return temperature**2 * loss.sum() / student.shape[0]


def official_binary_kl_norm(student, teacher, temperature):
    """DHKD eq. 5 as the official code states it: σ(u) clamped likewise, target [½, ½]."""
    q = torch.clamp(torch.sigmoid((student - teacher) / temperature), min=1e-8, max=1 - 1e-8)
    half = torch.full_like(q, 0.5)
    loss = F.kl_div(torch.log(q), half, reduction="none") + F.kl_div(torch.log(1 - q), 1 - half, reduction="none")
    return temperature**2 * loss.sum() / student.shape[0]


CASES = [(binary_kl_loss, official_binary_kl), (binary_kl_norm_loss, official_binary_kl_norm)]


def float32_logits(scale, seed=0, shape=(16, 100)):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


@pytest.mark.parametrize("fn,official", CASES)
@pytest.mark.parametrize("scale", [1.0, 10.0, 30.0])  # 30: many entries beyond both clamps
@pytest.mark.parametrize("temperature", [1.0, 2.0, 4.0])
def test_official_form_is_the_official_expression(fn, official, scale, temperature):
    """Elementwise the same float32 operations; the sum runs per row then over rows (as every loss here
    reduces) instead of over all entries at once, so values agree to float32 rounding, and inf/NaN exactly."""
    s, t = float32_logits(scale, 0), float32_logits(scale, 1)
    got, want = fn(s, t, temperature, form="official"), official(s, t, temperature)
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-6, atol=0, equal_nan=True)
    s1, s2 = s.clone().requires_grad_(), s.clone().requires_grad_()
    g_got = torch.autograd.grad(fn(s1, t, temperature, form="official"), s1)[0]
    g_want = torch.autograd.grad(official(s2, t, temperature), s2)[0]
    torch.testing.assert_close(g_got.nan_to_num(), g_want.nan_to_num(), rtol=2e-6, atol=0)


@pytest.mark.parametrize("fn,official", CASES)
def test_official_equals_stable_where_no_clamp_binds(fn, official):
    # |z/τ| ≤ 5 keeps σ in [0.0067, 0.9933]: neither 1e-8 nor the float32 bound 1.0 is reached.
    s, t = (float32_logits(1.0, i).double().clamp(-5, 5) * 2 for i in (2, 3))
    stable, clamped = fn(s, t, 2.0), fn(s, t, 2.0, form="official")
    torch.testing.assert_close(clamped, stable, rtol=1e-12, atol=1e-12)
    s32, t32 = s.float(), t.float()
    torch.testing.assert_close(fn(s32, t32, 2.0, form="official"), fn(s32, t32, 2.0), rtol=1e-5, atol=1e-5)


def test_float32_upper_clamp_rounds_to_one():
    assert torch.tensor(1 - 1e-8, dtype=torch.float32).item() == 1.0  # so the upper clamp never binds
    threshold = 2.0 * 24 * math.log(2)  # σ(x/2) rounds to 1.0 in float32 once e^(−x/2) < 2^−24
    assert torch.sigmoid(torch.tensor(threshold / 2 - 0.05)).item() < 1.0
    assert torch.sigmoid(torch.tensor(threshold / 2 + 0.05)).item() == 1.0


@pytest.mark.parametrize("teacher,expect", [(0.0, "inf"), (40.0, "nan")])
def test_official_binary_kl_blows_up_at_logit_40(teacher, expect):
    """The documented behaviour at τ = 2: a student logit of 40 gives log(1 − 1.0) = −inf; the term is
    +inf when the teacher's 1 − q_t > 0 and 0·(−inf) = NaN when the teacher saturates too."""
    s, t = torch.tensor([[40.0, 1.0]]), torch.tensor([[teacher, -1.0]])
    loss = binary_kl_loss(s, t, 2.0, form="official")
    assert (loss.isinf() and loss > 0) if expect == "inf" else loss.isnan()
    assert torch.isfinite(binary_kl_loss(s, t, 2.0))  # the stable form stays finite
    assert torch.isfinite(binary_kl_loss(torch.tensor([[33.0, 1.0]]), t, 2.0, form="official"))


def test_official_binary_kl_norm_blows_up_when_the_student_leads_by_40():
    s, t = torch.tensor([[45.0]]), torch.tensor([[5.0]])
    assert binary_kl_norm_loss(s, t, 2.0, form="official").isinf()
    assert torch.isfinite(binary_kl_norm_loss(s, t, 2.0))


def test_unknown_form_names_the_choices():
    s = float32_logits(1.0)
    with pytest.raises(KdcollapseError, match="official, stable"):
        binary_kl_loss(s, s, form="offical")
    with pytest.raises(KdcollapseError, match="official, stable"):
        binary_kl_norm_loss(s, s, form="clamped")


# --- the methods and the trainer ---------------------------------------------------------------------

@pytest.mark.parametrize("name,part,loss", [("ce_binarykl", "binary_kl", binary_kl_loss),
                                            ("dhkd", "binary_kl_norm", binary_kl_norm_loss)])
def test_methods_select_the_form(name, part, loss):
    torch.manual_seed(0)
    student = create_model("mlp", 4, in_channels=1, input_size=3, hidden=(8,))
    teacher = FrozenTeacher(create_model("mlp", 4, in_channels=1, input_size=3, hidden=(8,)))
    x, y = torch.randn(6, 9) * 200, torch.randint(0, 4, (6,))  # logits far beyond the clamps
    outs = {}
    for form in ("stable", "official"):
        method = build_method(method_config({"name": name, "alpha": 0.5, "binary_kl_form": form}), student,
                              num_classes=4, teacher=teacher)
        outs[form] = method(x, y)[part]
        head = method.aux_head(student.forward_features(x)) if name == "dhkd" else student(x)
        assert torch.equal(outs[form], 0.5 * loss(head, method.teacher_logits(x), 2.0, form=form))
        assert (method.divergence_hint is None) == (form == "stable")
    assert not torch.equal(outs["stable"], outs["official"])
    with pytest.raises(ConfigError, match="binary_kl_form"):
        method_config({"name": name, "binary_kl_form": "clamped"})


@pytest.mark.parametrize("aux_loss,what", [("binary_kl_norm", "an auxiliary-head logit minus the teacher's exceeds"),
                                           ("binary_kl", "an auxiliary-head logit exceeds")])
def test_dhkd_hint_names_the_quantity_its_clamp_bounds(aux_loss, what):
    """BinaryKL-Norm clamps σ((z_s − z_t)/τ), the plain BinaryKL σ(z_s/τ): the same 16.6·τ bound on different
    quantities (checked numerically above)."""
    student = create_model("mlp", 4, in_channels=1, input_size=3, hidden=(8,))
    teacher = FrozenTeacher(create_model("mlp", 4, in_channels=1, input_size=3, hidden=(8,)))
    method = build_method(method_config({"name": "dhkd", "binary_kl_form": "official", "aux_loss": aux_loss}),
                          student, num_classes=4, teacher=teacher)
    assert f"{what} 33.3 (24·ln 2·τ at τ = 2)" in method.divergence_hint


def test_trainer_names_the_official_clamp_when_the_loss_blows_up(tmp_path):
    """A teacher with huge logits drags the student's past 33 at once: the official form's loss turns
    inf/NaN and the trainer's guard says why; the stable form trains on from the same start."""
    tiny = ["data.name=digits", "data.batch_size=16", "data.train_per_class=20", "train.progress=false",
            "schedule.name=constant", "model.name=mlp", "model.kwargs={input_size: 8, hidden: [16]}"]
    teacher = fit(load_config(None, [*tiny, f"run_dir={tmp_path / 't'}", "train.epochs=1"])).run_dir
    tensors, meta = load_tensors(teacher / "model.safetensors")
    save_tensors(tmp_path / "loud.safetensors",
                 {k: v * 100 if k.startswith("head.") else v for k, v in tensors.items()}, meta)
    common = [*tiny, "train.epochs=1", "optim.lr=2.0", "optim.weight_decay=0", "method.name=ce_binarykl",
              "teacher.model=mlp", f"teacher.weights={tmp_path / 'loud.safetensors'}"]
    with pytest.raises(TrainingDiverged, match=r"binary_kl_form=official reproduces the official clamp.*33\.3"):
        fit(load_config(None, [*common, f"run_dir={tmp_path / 'official'}", "method.binary_kl_form=official"]))
    fit(load_config(None, [*common, f"run_dir={tmp_path / 'stable'}"]))
