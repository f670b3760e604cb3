"""The logit methods of issue 24 (NKD, WTTM, CTKD; logit standardization on KD, DKD, CTKD): their losses
inside the methods equal the official code; CTKD's learned temperature and its curriculum. (CTKD under DDP:
tests/test_methods.py, in the shared two-process run; MLKD: tests/test_mlkd.py.)"""

import math
import re

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.config import method_config
from kdcollapse.errors import ConfigError
from kdcollapse.methods import FrozenTeacher, build_method, get_method, list_methods
from kdcollapse.methods.ctkd import curriculum
from kdcollapse.models import create_model
from test_losses_logit_methods import official_dkd, official_kd, official_nkd, official_wttm

K, D = 5, 9


def make(name, seed=0, **section):
    torch.manual_seed(seed)
    student = create_model("mlp", K, in_channels=1, input_size=3, hidden=(12,)).double()
    teacher = FrozenTeacher(create_model("mlp", K, in_channels=1, input_size=3, hidden=(16,)).double())
    return build_method(method_config({"name": name, **section}), student, num_classes=K, teacher=teacher).double()


def batch(n=16, seed=2):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 1, 3, 3, generator=g, dtype=torch.float64), torch.randint(0, K, (n,), generator=g)


def grads(loss, params):
    return torch.autograd.grad(loss, params, allow_unused=True, materialize_grads=True)


def assert_method_equals(m, official_loss, epoch=0, teacher_dtype=torch.float64):
    """The method's loss and its gradients w.r.t. every trainable parameter equal the official ones, to
    1e-6: the teacher's logits are float32 (what every method reads), which the method may z-score in
    float32; the losses alone are compared to 1e-10 in tests/test_losses_logit_methods.py."""
    x, y = batch()
    m.train()
    m.on_epoch_start(epoch)
    out = m(x, y)
    logits = m.student(x)
    z_t = m.teacher_logits(x).to(teacher_dtype)  # the float32 values the method reads
    reference = official_loss(logits, z_t, y).reshape(())
    params = [p for p in m.parameters() if p.requires_grad]
    torch.testing.assert_close(out["loss"], reference, rtol=1e-6, atol=1e-9)
    for g, g_ref in zip(grads(out["loss"], params), grads(reference, params)):
        torch.testing.assert_close(g, g_ref, rtol=1e-6, atol=1e-6 * g_ref.abs().max().item())


# --- official losses inside the methods -----------------------------------------------------------

def test_nkd_and_wttm_methods_are_ce_plus_the_official_losses():
    assert_method_equals(make("nkd"), lambda s, t, y: F.cross_entropy(s, y) + official_nkd(s, t, y, 1.0, 1.5))
    assert_method_equals(make("wttm", gamma=0.3, wttm_weight=2.0),
                         lambda s, t, y: F.cross_entropy(s, y) + 2.0 * official_wttm(s, t, 0.3))


def test_logit_standardization_in_kd_and_dkd_is_the_official_switch():
    """The authors' --logit-stand --base-temp 2 --kd-weight 9 (tools/train.py): KD weight 9 at τ = 2; DKD
    α, β multiplied by 9 at τ = 2 (after its warm-up, epoch 20 here)."""
    assert_method_equals(make("kd", logit_standardization=True, temperature=2.0, kd_weight=9.0),
                         lambda s, t, y: 0.1 * F.cross_entropy(s, y) + 9.0 * official_kd(s, t, 2.0, True),
                         teacher_dtype=torch.float32)  # z-scored in float32 by both
    assert_method_equals(make("dkd", logit_standardization=True, temperature=2.0, alpha=9.0, beta=72.0),
                         lambda s, t, y: F.cross_entropy(s, y) + official_dkd(s, t, y, 9.0, 72.0, 2.0, True),
                         epoch=19, teacher_dtype=torch.float32)
    with pytest.raises(ConfigError, match="not for method 'nkd'") as err:
        method_config({"name": "nkd", "logit_standardization": True})
    takes = {n for n in list_methods() if "logit_standardization" in get_method(n).Config.__dataclass_fields__}
    named = re.search(r"defined for ([\w, ]+) \(", str(err.value)).group(1).split(", ")
    assert {"kd", "dkd", "ctkd"} <= takes == set(named)  # the methods that have the switch, in any order
    # the standardized KD reads the whole logit row, so top-k stored teacher logits are refused
    assert get_method("kd").teacher_request(method_config({"name": "kd"})).temperature == 4.0
    assert get_method("kd").teacher_request(
        method_config({"name": "kd", "logit_standardization": True})).temperature is None


# --- CTKD -----------------------------------------------------------------------------------------

class OfficialGradientReversal(torch.autograd.Function):
    """zhengli97/CTKD @ 7d5252241259ae70d38a832371fed9697d15fc14, models/temp_global.py,
    GradientReversalFunction (backward multiplies by lambda_, which the caller makes negative)."""

    @staticmethod
    def forward(ctx, x, lambda_):
        ctx.lambda_ = lambda_
        return x.clone()

    @staticmethod
    def backward(ctx, grads):
        lambda_ = grads.new_tensor(ctx.lambda_)
        return lambda_ * grads, None


def official_cosine_decay(i, max_value, min_value, num_loops):
    """Same commit, train_student.py, CosineDecay.get_value."""
    if i < 0:
        i = 0
    if i >= num_loops:
        i = num_loops
    value = (math.cos(i * math.pi / num_loops) + 1.0) * 0.5
    return value * (max_value - min_value) + min_value


def official_distill_kl(y_s, y_t, T):
    """Same commit, distiller_zoo/KD.py, DistillKL.forward (without .cuda())."""
    return torch.nn.KLDivLoss(reduction='batchmean')(F.log_softmax(y_s / T, dim=1),
                                                       F.softmax(y_t / T, dim=1)) * T * T


def test_ctkd_curriculum_is_the_official_cosine_decay_with_the_sign_flipped():
    for epoch in range(15):  # our 0-based epoch e is the official loop's epoch e + 1
        assert curriculum(epoch, 1.0, 10) == pytest.approx(-official_cosine_decay(epoch + 1, 0, -1, 10), abs=1e-15)
    assert curriculum(0, 1.0, 10) > 0 and curriculum(9, 1.0, 10) == 1.0 and curriculum(30, 1.0, 10) == 1.0


@pytest.mark.parametrize("epoch", [0, 4, 12])
def test_ctkd_loss_and_the_reversed_temperature_gradient_equal_official(epoch):
    m = make("ctkd")
    lambda_official = official_cosine_decay(epoch + 1, 0, -1, 10)

    def official(s, t, y):  # loops.py train_distill: temp = t_start + t_end * sigmoid(Global_T(...))
        temp = 1.0 + 20.0 * torch.sigmoid(OfficialGradientReversal.apply(m.theta, lambda_official))
        return 0.1 * F.cross_entropy(s, y) + 0.9 * official_distill_kl(s, t, temp)

    assert_method_equals(m, official, epoch)
    x, y = batch()
    m.on_epoch_start(epoch)
    (g_theta,) = grads(m(x, y)["loss"], [m.theta])
    if epoch > 0:  # the reversed gradient ascends the distillation loss: opposite to plain descent
        plain = 0.9 * official_distill_kl(m.student(x), m.teacher_logits(x).double(), 1.0 + 20.0 * torch.sigmoid(m.theta))
        (g_plain,) = grads(plain, [m.theta])
        torch.testing.assert_close(g_theta, -curriculum(epoch, 1.0, 10) * g_plain, rtol=1e-10, atol=1e-12)


def test_ctkd_temperature_is_trained_state():
    m = make("ctkd", logit_standardization=True)
    assert "theta" in m.state_dict() and any(p is m.theta for g in m.optimizer_groups() for p in g["params"])
    x, y = batch()
    m.on_epoch_start(5)
    out = m(x, y)
    assert out["temperature"] == pytest.approx(1 + 20 / (1 + math.exp(-1)))
    before = m.theta.detach().clone()
    opt = torch.optim.SGD(m.parameters(), lr=1.0)
    out["loss"].backward()
    opt.step()
    assert not torch.equal(m.theta.detach(), before)
