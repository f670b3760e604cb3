"""Attacks (PGD, TRADES, APGD, APGD-T, FAB-T, Square) and the AutoAttack-standard evaluation.

Tiny models on synthetic 3×8×8 images; the whole file runs in well under a minute on one core.
"""

import math
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import linprog, minimize
from torch import nn

from kdcollapse.adversarial import (
    AttackStage,
    Normalized,
    apgd_attack,
    apgd_checkpoints,
    apgd_targeted_attack,
    autoattack_chain,
    autoattack_standard,
    dlr_loss,
    dlr_targeted_loss,
    evaluate_attacks,
    fab_attack,
    lp_norm,
    margin,
    pgd_attack,
    pgd_evaluate,
    project_onto_hyperplane_in_box,
    square_attack,
    square_p_schedule,
    trades_attack,
)
from kdcollapse.adversarial._apgd import halve_step_size
from kdcollapse.adversarial._common import in_threat_model
from kdcollapse.errors import KdcollapseError

K, C, H = 10, 3, 8


# --------------------------------------------------------------------------------------------- fixtures
def _synthetic(n: int, templates: torch.Tensor, generator: torch.Generator):
    """Images 0.5 + 0.08·T_y + 0.2·noise with spatially smooth class templates T (2×2 blocks)."""
    y = torch.randint(0, K, (n,), generator=generator)
    x = 0.5 + 0.08 * templates[y] + 0.2 * torch.randn(n, C, H, H, generator=generator)
    return x.clamp(0, 1), y


@pytest.fixture(scope="module")
def task():
    """An undefended MLP trained for ~0.5 s, and 64 test points."""
    g = torch.Generator().manual_seed(0)
    templates = F.interpolate(torch.randn(K, C, 2, 2, generator=g), size=(H, H))
    x, y = _synthetic(3000, templates, g)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(C * H * H, 64), nn.ReLU(), nn.Linear(64, K))
    opt = torch.optim.Adam(model.parameters(), 1e-2)
    for _ in range(150):
        idx = torch.randint(0, len(x), (128,), generator=g)
        loss = F.cross_entropy(model(x[idx]), y[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
    opt.zero_grad(set_to_none=True)
    x_test, y_test = _synthetic(64, templates, g)
    return model, x_test, y_test


def _accuracy(model, x, y) -> float:
    with torch.no_grad():
        return (model(x).argmax(1) == y).float().mean().item()


def _gen(seed=0):
    return torch.Generator().manual_seed(seed)


# Every attack with a small budget, as f(model, x, y, norm, eps, generator) -> x_adv.
ATTACKS = {
    "pgd": lambda m, x, y, n, e, g: pgd_attack(m, x, y, norm=n, eps=e, step_size=e / 4, steps=10, generator=g),
    "trades": lambda m, x, y, n, e, g: trades_attack(m, x, norm=n, eps=e, step_size=e / 4, steps=10, generator=g),
    "apgd-ce": lambda m, x, y, n, e, g: apgd_attack(m, x, y, norm=n, eps=e, n_iter=10, generator=g),
    "apgd-dlr": lambda m, x, y, n, e, g: apgd_attack(m, x, y, norm=n, eps=e, n_iter=10, loss="dlr", generator=g),
    "apgd-t": lambda m, x, y, n, e, g: apgd_targeted_attack(m, x, y, norm=n, eps=e, n_iter=10, n_targets=3,
                                                            generator=g),
    "fab-t": lambda m, x, y, n, e, g: fab_attack(m, x, y, norm=n, eps=e, n_iter=10, n_targets=3),
    "square": lambda m, x, y, n, e, g: square_attack(m, x, y, norm=n, eps=e, n_queries=300, generator=g),
}
CHEAP = {  # for the property and side-effect tests, where only the constraints matter
    "pgd": lambda m, x, y, n, e, g: pgd_attack(m, x, y, norm=n, eps=e, step_size=e / 2, steps=2, generator=g),
    "trades": lambda m, x, y, n, e, g: trades_attack(m, x, norm=n, eps=e, step_size=e / 2, steps=2, generator=g),
    "apgd-ce": lambda m, x, y, n, e, g: apgd_attack(m, x, y, norm=n, eps=e, n_iter=4, generator=g),
    "apgd-dlr": lambda m, x, y, n, e, g: apgd_attack(m, x, y, norm=n, eps=e, n_iter=3, loss="dlr", generator=g),
    "apgd-t": lambda m, x, y, n, e, g: apgd_targeted_attack(m, x, y, norm=n, eps=e, n_iter=3, n_targets=2,
                                                            generator=g),
    "fab-t": lambda m, x, y, n, e, g: fab_attack(m, x, y, norm=n, eps=e, n_iter=4, n_targets=2),
    "square": lambda m, x, y, n, e, g: square_attack(m, x, y, norm=n, eps=e, n_queries=12, generator=g),
}


# ------------------------------------------------------------------------------ constraints (property)
@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    norm=st.sampled_from(["Linf", "L2"]),
    eps=st.floats(1e-3, 2.0),
    b=st.integers(1, 4),
    c=st.integers(1, 3),
    h=st.integers(2, 7),
    k=st.integers(4, 6),
)
def test_attacks_stay_in_ball_and_box(seed, norm, eps, b, c, h, k):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(c * h * h, 8), nn.Tanh(), nn.Linear(8, k))
    x = torch.rand(b, c, h, h)
    x[torch.rand_like(x) < 0.2] = 0.0  # pixels on the box faces
    x[torch.rand_like(x) < 0.2] = 1.0
    y = torch.randint(0, k, (b,))
    eps = eps if norm == "L2" else eps / 4
    for name, attack in CHEAP.items():
        x_adv = attack(model, x, y, norm, eps, _gen(seed))
        assert x_adv.shape == x.shape and not x_adv.requires_grad, name
        assert in_threat_model(x_adv, x, norm, eps).all(), (name, lp_norm(x_adv - x, norm).max().item())


def test_unbounded_fab_stays_in_box(task):
    model, x, y = task
    x_adv = fab_attack(model, x[:16], y[:16], eps=None, n_iter=10, n_targets=2)
    assert ((x_adv >= 0) & (x_adv <= 1)).all()
    fooled = model(x_adv).argmax(1) != y[:16]
    assert fooled.float().mean() > 0.9  # no ε bound: the minimal adversarial example is returned


# ---------------------------------------------------------------------------------------- strength
@pytest.mark.parametrize("name", list(ATTACKS))
@pytest.mark.parametrize("norm,eps", [("Linf", 0.1), ("L2", 2.0)])
def test_undefended_model_is_broken(task, name, norm, eps):
    model, x, y = task
    assert _accuracy(model, x, y) > 0.9
    x_adv = ATTACKS[name](model, x, y, norm, eps, _gen())
    if name == "trades":  # label-free: it pushes the prediction away rather than forcing an error
        assert _accuracy(model, x_adv, y) < 0.5
    else:
        assert _accuracy(model, x_adv, y) <= 0.05


def test_square_beats_gradient_masking_where_pgd_fails(task):
    """Rounding the input makes every input gradient zero: PGD cannot move, Square does not care."""
    model, x, y = task

    class Quantize(nn.Module):
        def forward(self, x):
            return torch.round(x * 8) / 8

    masked = nn.Sequential(Quantize(), model)
    clean = _accuracy(masked, x, y)
    assert clean > 0.9
    x_pgd = pgd_attack(masked, x, y, eps=0.1, step_size=0.025, steps=10, random_start=False)
    assert torch.equal(x_pgd, x)  # zero gradient, sign(0) = 0: PGD never leaves x
    assert _accuracy(masked, pgd_attack(masked, x, y, eps=0.1, step_size=0.025, steps=10, generator=_gen()), y) > 0.9
    assert _accuracy(masked, square_attack(masked, x, y, eps=0.1, n_queries=300, generator=_gen()), y) <= 0.05


def test_square_never_calls_backward(task):
    model, x, y = task

    class NoBackward(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x.clone()

        @staticmethod
        def backward(ctx, g):
            raise RuntimeError("backward called")

    guarded = lambda z: model(NoBackward.apply(z))  # noqa: E731
    square_attack(guarded, x[:8], y[:8], eps=0.05, n_queries=20, generator=_gen())
    with pytest.raises(RuntimeError, match="backward called"):
        pgd_attack(guarded, x[:8], y[:8], eps=0.05, step_size=0.01, steps=1)


# ------------------------------------------------------------------------------ model side effects
class Probe(nn.Module):
    """Records the mode it is called in; BatchNorm and Dropout make eval mode matter."""

    def __init__(self, fail_after: int | None = None):
        super().__init__()
        self.net = nn.Sequential(nn.Flatten(), nn.Linear(C * 4 * 4, 16), nn.BatchNorm1d(16), nn.ReLU(),
                                 nn.Dropout(0.5), nn.Linear(16, 5))
        self.modes: list[bool] = []
        self.fail_after = fail_after

    def forward(self, x):
        self.modes.append(self.training)
        if self.fail_after is not None and len(self.modes) > self.fail_after:
            raise ValueError("boom")
        return self.net(x)


def _probe_batch(probe: Probe, n: int):
    """Inputs labelled with the probe's own predictions, so that every attack has work to do."""
    x = torch.rand(n, C, 4, 4)
    probe.eval()
    with torch.no_grad():
        y = probe(x).argmax(1)
    probe.modes.clear()
    return x, y


@pytest.mark.parametrize("name", list(CHEAP))
def test_eval_mode_during_attack_and_modes_and_grads_restored(name):
    probe = Probe()
    x, y = _probe_batch(probe, 6)
    probe.train()
    probe.net[2].eval()  # mixed modes must come back exactly as they were
    bn_mean = probe.net[2].running_mean.clone()
    CHEAP[name](probe, x, y, "Linf", 0.1, _gen())
    assert probe.modes and not any(probe.modes)
    assert [m.training for m in probe.modules()] == [True, True, True, True, False, True, True, True]
    assert all(p.grad is None for p in probe.parameters())
    assert torch.equal(probe.net[2].running_mean, bn_mean)


@pytest.mark.parametrize("name", list(CHEAP))
def test_mode_restored_after_exception(name):
    probe = Probe()
    x, y = _probe_batch(probe, 4)
    probe.fail_after = 1  # the first model call succeeds, the second raises
    probe.train()
    with pytest.raises(ValueError, match="boom"):
        CHEAP[name](probe, x, y, "Linf", 0.1, _gen())
    assert all(m.training for m in probe.modules())


def test_attack_inside_no_grad_context(task):
    model, x, y = task
    with torch.no_grad():
        x_adv = apgd_attack(model, x[:8], y[:8], eps=0.1, n_iter=5, generator=_gen())
    assert _accuracy(model, x_adv, y[:8]) < 0.5


# ----------------------------------------------------------------------------------------- losses
def _dlr_reference(z, y, t=None):
    out = []
    for row, label, target in zip(z.double().tolist(), y.tolist(), (t.tolist() if t is not None else [None] * len(y))):
        top = sorted(row, reverse=True)
        if target is None:
            best_other = max(v for j, v in enumerate(row) if j != label)
            out.append(-(row[label] - best_other) / (top[0] - top[2]))
        else:
            out.append(-(row[label] - row[target]) / (top[0] - 0.5 * (top[2] + top[3])))
    return torch.tensor(out, dtype=torch.float64)


def test_dlr_against_slow_reference():
    torch.manual_seed(1)
    z, y = torch.randn(50, 7) * 3, torch.randint(0, 7, (50,))
    t = (y + torch.randint(1, 7, (50,))) % 7
    torch.testing.assert_close(dlr_loss(z, y).double(), _dlr_reference(z, y), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(dlr_targeted_loss(z, y, t).double(), _dlr_reference(z, y, t), rtol=1e-5, atol=1e-5)
    # shift and positive-scale invariance (the point of the ratio)
    torch.testing.assert_close(dlr_loss(2.5 * z + 7, y), dlr_loss(z, y), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(dlr_targeted_loss(0.3 * z - 1, y, t), dlr_targeted_loss(z, y, t), rtol=1e-4, atol=1e-5)


def test_margin_sign_is_misclassification():
    torch.manual_seed(2)
    z, y = torch.randn(100, 5), torch.randint(0, 5, (100,))
    assert torch.equal(margin(z, y) < 0, z.argmax(1) != y)


def test_dlr_needs_enough_classes():
    with pytest.raises(KdcollapseError, match="the DLR loss needs at least 3 classes .*got 2"):
        dlr_loss(torch.randn(4, 2), torch.zeros(4, dtype=torch.long))
    with pytest.raises(KdcollapseError, match="the targeted DLR loss needs at least 4 classes .*got 3"):
        dlr_targeted_loss(torch.randn(4, 3), torch.zeros(4, dtype=torch.long), torch.ones(4, dtype=torch.long))
    x = torch.rand(4, C, 4, 4)
    two, three = (nn.Sequential(nn.Flatten(), nn.Linear(C * 4 * 4, k)) for k in (2, 3))
    wrong = torch.full((4,), 2, dtype=torch.long)  # no point classified correctly: still refused
    with pytest.raises(KdcollapseError, match="APGD-DLR needs at least 3 classes"):
        apgd_attack(two, x, wrong, eps=0.1, loss="dlr")
    with pytest.raises(KdcollapseError, match="APGD-T needs at least 4 classes .*got 3"):
        apgd_targeted_attack(three, x, wrong, eps=0.1)
    with pytest.raises(KdcollapseError, match="AutoAttack standard .* needs at least 4 classes"):
        autoattack_standard(three, x, wrong, progress=False)


# ------------------------------------------------------------------------------------------- APGD
def test_apgd_checkpoints_follow_the_published_recursion():
    # p = 0.22, 0.41, 0.57, 0.70, 0.80, 0.87, 0.93, 0.99 (steps 0.19, 0.16, 0.13, 0.10, 0.07, 0.06, 0.06)
    assert apgd_checkpoints(100) == [22, 41, 57, 70, 80, 87, 93, 99]
    assert apgd_checkpoints(1000) == [220, 410, 570, 700, 800, 870, 930, 990]
    assert apgd_checkpoints(10) == [3, 5, 6, 7, 8, 9, 10]  # ⌈p·10⌉, duplicates merged


def test_apgd_halving_conditions():
    # condition 1: fewer than ρ·22 = 16.5 improving steps; condition 2: not halved last time, no progress
    halve = halve_step_size(
        n_increased=torch.tensor([10.0, 17, 17, 17, 16]), steps_since_last=22, rho=0.75,
        halved_at_last=torch.tensor([False, False, True, False, True]),
        f_max=torch.tensor([1.0, 1, 1, 2, 3]), f_max_at_last=torch.tensor([1.0, 1, 1, 1, 3]),
    )
    assert halve.tolist() == [True, True, False, False, True]


@pytest.mark.parametrize("norm,eps", [("Linf", 0.05), ("L2", 0.3)])
def test_apgd_reaches_the_maximiser_of_a_monotone_objective(norm, eps):
    """CE of a linear model where only one wrong class matters is increasing in ⟨v, x⟩: its maximiser
    over the ball (x in the box interior) is x + ε·sign(v) (ℓ∞) or x + ε·v/‖v‖ (ℓ2)."""
    torch.manual_seed(3)
    d = C * 4 * 4
    v = torch.randn(d)
    lin = nn.Linear(d, 4)
    with torch.no_grad():
        lin.weight.zero_()
        lin.weight[1] = v / v.abs().sum()  # |⟨v, δ⟩| ≤ ε: the label stays top, CE stays a smooth function
        lin.bias.copy_(torch.tensor([5.0, 0.0, -30.0, -30.0]))
    model = nn.Sequential(nn.Flatten(), lin)
    x, y = 0.3 + 0.4 * torch.rand(5, C, 4, 4), torch.zeros(5, dtype=torch.long)
    x_adv = apgd_attack(model, x, y, norm=norm, eps=eps, n_iter=30, generator=_gen())
    step = torch.sign(v) if norm == "Linf" else v / v.norm()
    x_star = x + eps * step.view(1, C, 4, 4)
    assert lp_norm(x_adv - x_star, norm).max() < 0.02 * eps + 1e-6


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_apgd_step_size_halving_converges_to_an_interior_maximiser(norm):
    """The cross-entropy of logits (50·(x_0 − c)², 0, 0, 0) is maximal at x_0 = c inside the ball:
    the sign steps oscillate around c, condition 1 fires at every checkpoint, and the halved steps
    (2ε/2^8 after the last one) pin x_0 to c. Without halving the iterates keep jumping by ~ε."""

    class Bowl(nn.Module):
        def forward(self, z):
            s = 50 * (z.flatten(1)[:, 0] - c) ** 2
            return torch.stack([s, torch.zeros_like(s), torch.zeros_like(s), torch.zeros_like(s)], 1)

    eps = 0.1 if norm == "Linf" else 0.3
    x = torch.full((4, 1, 2, 2), 0.5)
    c = 0.5 + 0.3 * eps * torch.tensor([1.0, -1.0, 0.5, -0.2])
    x_adv = apgd_attack(Bowl(), x, torch.zeros(4, dtype=torch.long), norm=norm, eps=eps, n_iter=100, generator=_gen())
    assert (x_adv.flatten(1)[:, 0] - c).abs().max() < 0.02 * eps


# -------------------------------------------------------------------------------------------- FAB
def _linf_reference(p, w, c):
    """min t s.t. |δ_i| ≤ t, ⟨w, δ⟩ = c, 0 ≤ p + δ ≤ 1 (a linear program)."""
    d = len(p)
    cost = np.r_[np.zeros(d), 1.0]
    eye = np.eye(d)
    a_ub = np.block([[eye, -np.ones((d, 1))], [-eye, -np.ones((d, 1))]])
    res = linprog(cost, A_ub=a_ub, b_ub=np.zeros(2 * d), A_eq=np.r_[w, 0.0][None], b_eq=[c],
                  bounds=[(-pi, 1 - pi) for pi in p] + [(0, None)], method="highs")
    return res.x[-1] if res.status == 0 else None


def _l2_reference(p, w, c):
    res = minimize(lambda z: z @ z, np.zeros(len(p)), jac=lambda z: 2 * z, method="SLSQP",
                   bounds=[(-pi, 1 - pi) for pi in p],
                   constraints=[{"type": "eq", "fun": lambda z: w @ z - c, "jac": lambda z: w}],
                   options={"ftol": 1e-14, "maxiter": 500})
    return res.x if res.success else None


@pytest.mark.parametrize("seed", range(8))
def test_hyperplane_projection_against_solvers(seed):
    rng = np.random.default_rng(seed)
    d = 7
    p = rng.uniform(0, 1, (1, d))
    p[0, :2] = [0.0, 1.0]
    w = rng.normal(size=(1, d))
    w[0, 2] = 0.0
    side = rng.choice([-1.0, 1.0])
    reach = (np.abs(w) * np.where(side * w > 0, 1 - p, p)).sum()  # the most ⟨w, δ⟩ the box allows
    c = side * rng.uniform(0, 0.95 * reach, 1)
    args = (torch.tensor(p, dtype=torch.float64), torch.tensor(w, dtype=torch.float64), torch.tensor(c))
    for norm in ("Linf", "L2"):
        delta = project_onto_hyperplane_in_box(*args, norm=norm)[0].numpy()
        assert abs(w[0] @ delta - c[0]) < 1e-9 and (p[0] + delta >= -1e-12).all() and (p[0] + delta <= 1 + 1e-12).all()
        if norm == "Linf":
            t = _linf_reference(p[0], w[0], c[0])
            assert t is not None and abs(np.abs(delta).max() - t) < 1e-7
        else:
            ref = _l2_reference(p[0], w[0], c[0])
            assert ref is not None and np.abs(delta - ref).max() < 1e-5


def test_hyperplane_projection_out_of_reach_goes_to_the_corner():
    p = torch.tensor([[0.2, 0.7, 0.5]], dtype=torch.float64)
    w = torch.tensor([[1.0, -2.0, 0.0]], dtype=torch.float64)
    for norm in ("Linf", "L2"):
        delta = project_onto_hyperplane_in_box(p, w, torch.tensor([100.0], dtype=torch.float64), norm)
        torch.testing.assert_close(delta, torch.tensor([[0.8, -0.7, 0.0]], dtype=torch.float64))
        zero = project_onto_hyperplane_in_box(p, w, torch.tensor([0.0], dtype=torch.float64), norm)
        assert torch.equal(zero, torch.zeros_like(p))


def test_fab_finds_near_minimal_perturbation_of_a_linear_model():
    """For an affine binary-like model the distance to the boundary is |g(x)|/‖w‖_1 (ℓ∞) in the
    interior of the box; FAB's closest adversarial example is within a few % of it."""
    torch.manual_seed(4)
    d = C * 4 * 4
    lin = nn.Linear(d, 4)
    with torch.no_grad():
        lin.weight.zero_()
        lin.weight[1] = torch.randn(d)
        lin.bias.copy_(torch.tensor([0.5, -0.5 * lin.weight[1].sum(), -50.0, -50.0]))  # g = ⟨w, x − ½⟩ − ½
    model = nn.Sequential(nn.Flatten(), lin)
    x = torch.full((3, C, 4, 4), 0.5)
    x = x + 0.01 * torch.randn_like(x)
    y = torch.zeros(3, dtype=torch.long)
    g = lin(x.flatten(1))[:, 1] - lin(x.flatten(1))[:, 0]
    assert (g < 0).all()
    dist = (-g / lin.weight[1].abs().sum()).detach()
    x_adv = fab_attack(model, x, y, eps=None, n_iter=20, n_targets=1)
    found = lp_norm(x_adv - x, "Linf")
    assert (model(x_adv).argmax(1) != y).all()
    assert (found <= dist * 1.1).all() and (found >= dist * 0.999).all()


# ----------------------------------------------------------------------------------------- Square
def test_square_p_schedule_is_the_published_one():
    assert [square_p_schedule(i) for i in (0, 10, 11, 50, 51, 200, 201, 500, 501)] == [
        0.8, 0.8, 0.4, 0.4, 0.2, 0.2, 0.1, 0.1, 0.05]
    assert square_p_schedule(8001) == pytest.approx(0.8 / 512)
    assert square_p_schedule(4999, n_queries=5000) == pytest.approx(0.8 / 128)  # standard: not rescaled
    assert square_p_schedule(4999, n_queries=5000, rescale=True) == pytest.approx(0.8 / 512)


@pytest.mark.parametrize("norm", ["Linf", "L2"])
def test_square_is_reproducible_and_monotone(task, norm):
    model, x, y = task
    eps = 0.04 if norm == "Linf" else 0.8
    a = square_attack(model, x, y, norm=norm, eps=eps, n_queries=50, generator=_gen(5))
    b = square_attack(model, x, y, norm=norm, eps=eps, n_queries=50, generator=_gen(5))
    assert torch.equal(a, b)
    more = square_attack(model, x, y, norm=norm, eps=eps, n_queries=200, generator=_gen(5))
    with torch.no_grad():  # the same random stream, more queries: the margin can only go down
        assert (margin(model(more), y) <= margin(model(a), y) + 1e-6).all()


# ----------------------------------------------------------------------------------- PGD / TRADES
def test_trades_attack_increases_kl_from_its_start(task):
    model, x, y = task
    with torch.no_grad():
        log_p = torch.log_softmax(model(x), 1)

    def kl(z):
        with torch.no_grad():
            return F.kl_div(torch.log_softmax(model(z), 1), log_p, log_target=True, reduction="none").sum(1)

    start = trades_attack(model, x, steps=0, generator=_gen())
    assert (lp_norm(start - x, "Linf") < 0.01).all()  # x + 0.001·N(0, I), clipped
    x_adv = trades_attack(model, x, generator=_gen())
    assert in_threat_model(x_adv, x, "Linf", 8 / 255).all()
    assert (kl(x_adv) > kl(start)).all() and kl(x_adv).mean() > 10 * kl(start).mean()


def test_targeted_pgd_reaches_the_target(task):
    model, x, y = task
    target = (y + 1) % K
    x_adv = pgd_attack(model, x, target, eps=0.15, step_size=0.02, steps=20, targeted=True, generator=_gen())
    assert _accuracy(model, x_adv, target) > 0.9


# ------------------------------------------------------------------------------------- validation
def test_bad_inputs_raise_clear_errors(task):
    model, x, y = task
    with pytest.raises(KdcollapseError, match=r"\[0, 1\].*Normalized"):
        pgd_attack(model, x * 3 - 1, y, eps=0.1, step_size=0.01, steps=1)
    with pytest.raises(KdcollapseError, match="unknown norm 'L1'.*Valid choices: L2, Linf"):
        apgd_attack(model, x, y, norm="L1", eps=0.1)
    with pytest.raises(KdcollapseError, match="eps must be a positive"):
        square_attack(model, x, y, eps=-1.0)
    with pytest.raises(KdcollapseError, match="y must be an int64 tensor of shape"):
        fab_attack(model, x, y[:3], eps=0.1)
    with pytest.raises(KdcollapseError, match="empty batch"):
        autoattack_standard(model, x[:0], y[:0], progress=False)
    with pytest.raises(KdcollapseError, match="NaN"):
        pgd_attack(model, torch.full_like(x, float("nan")), y, eps=0.1, step_size=0.01, steps=1)
    with pytest.raises(KdcollapseError, match="needs images"):
        square_attack(lambda z: z, x.flatten(1), y, eps=0.1)
    with pytest.raises(KdcollapseError, match="unknown APGD loss 'cw'"):
        apgd_attack(model, x, y, eps=0.1, loss="cw")
    with pytest.raises(KdcollapseError, match="must return \\(B, K\\) logits"):
        apgd_attack(lambda z: z.sum(), x, y, eps=0.1)
    with pytest.raises(KdcollapseError, match="unknown AutoAttack version 'plus'"):
        autoattack_standard(model, x, y, version="plus")


def test_normalized_wrapper():
    inner = nn.Conv2d(3, 2, 1)
    mean, std = [0.4914, 0.4822, 0.4465], [0.2470, 0.2435, 0.2616]
    wrapped = Normalized(inner, mean, std)
    x = torch.rand(2, 3, 5, 5)
    expected = inner((x - torch.tensor(mean).view(1, 3, 1, 1)) / torch.tensor(std).view(1, 3, 1, 1))
    torch.testing.assert_close(wrapped(x), expected)
    assert "mean" in wrapped.state_dict()
    with pytest.raises(KdcollapseError, match="channels"):
        Normalized(inner, [0.5, 0.5], std)
    with pytest.raises(KdcollapseError, match="std must be positive"):
        Normalized(inner, mean, [0.2, 0.0, 0.2])


# ------------------------------------------------------------------------------------- evaluation
def _key(row: torch.Tensor) -> bytes:
    return row.numpy().tobytes()


def _recording(name, attack, log):
    """Wrap an attack to log (inputs, labels, outputs) of every batch it is given."""

    def run(model, x, y):
        out = attack(model, x, y)
        log.append((name, x.clone(), y.clone(), out.clone()))
        return out

    return name, run


def _check_accounting(model, x, y, result, log, eps, norm="Linf"):
    """Only still-robust points attacked, counts consistent, non-increasing accuracy, x_adv verified."""
    with torch.no_grad():
        correct = model(x).argmax(1) == y
    assert result.clean_accuracy == pytest.approx(correct.float().mean().item())
    remaining = {_key(r) for r in x[correct]}
    previous = result.clean_accuracy
    for stage in result.stages:
        batches = [(bx, by, out) for name, bx, by, out in log if name == stage.name]
        given = [_key(r) for bx, _, _ in batches for r in bx]
        assert len(given) == len(set(given)) == stage.attacked
        assert set(given) == remaining  # exactly the points no earlier attack broke
        with torch.no_grad():
            broken = {_key(r) for bx, by, out in batches for r, f in zip(bx, model(out).argmax(1) != by) if f}
        assert len(broken) == stage.broken
        remaining -= broken
        assert stage.robust_accuracy == pytest.approx(len(remaining) / len(x))
        assert stage.robust_accuracy <= previous
        previous = stage.robust_accuracy
    assert result.robust_accuracy == pytest.approx(previous) and result.unconfirmed == 0
    assert in_threat_model(result.x_adv, x, norm, eps).all()
    with torch.no_grad():
        assert torch.equal(model(result.x_adv).argmax(1) == y, result.robust)
    assert torch.equal(result.x_adv[result.robust], x[result.robust])


def test_chain_accounting_with_the_autoattack_attacks(task):
    model, x, y = task
    eps, log = 0.03, []
    chain = autoattack_chain("Linf", eps, n_iter=5, n_targets=2, n_queries=40, generator=_gen())
    chain = [_recording(name, attack, log) for name, attack in chain]
    result = evaluate_attacks(model, x, y, chain, norm="Linf", eps=eps, batch_size=16, progress=False)
    assert [s.name for s in result.stages] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert all(s.attacked > 0 for s in result.stages) and result.stages[0].broken > 0
    _check_accounting(model, x, y, result, log, eps)
    summary = result.summary()
    assert summary["stages"][0]["attack"] == "apgd-ce" and summary["n"] == len(x)
    assert "| apgd-t |" in result.table()


def test_autoattack_standard_end_to_end(task):
    model, x, y = task
    result = autoattack_standard(model, x[:32], y[:32], eps=0.1, batch_size=16, progress=False)
    assert [s.name for s in result.stages] == ["apgd-ce", "apgd-t", "fab-t", "square"]
    assert result.clean_accuracy > 0.9 and result.robust_accuracy == 0.0
    assert all(isinstance(s, AttackStage) and s.images_per_second > 0 for s in result.stages[:1])
    assert in_threat_model(result.x_adv, x[:32], "Linf", 0.1).all()
    assert "| square | 0 | | 0.00% | | |" in result.table()  # stages left with nothing to attack


def test_pgd_evaluate(task):
    model, x, y = task
    result = pgd_evaluate(model, x, y, eps=0.05, steps=10, progress=False)
    assert [s.name for s in result.stages] == ["pgd-10"]
    assert result.robust_accuracy < 0.5 * result.clean_accuracy


def test_out_of_ball_attack_is_rejected(task):
    model, x, y = task
    bad = ("sloppy", lambda m, xb, yb: (xb + 0.2).clamp(0, 1))
    with pytest.raises(RuntimeError, match="attack 'sloppy' returned .* outside the Linf ball"):
        evaluate_attacks(model, x, y, [bad], norm="Linf", eps=0.1, progress=False)


def test_unconfirmed_adversarial_examples_count_as_robust(task):
    """A model whose decisions change between the chain and the final check (as nondeterministic
    kernels could): the final check wins, and the disagreement is reported."""
    model, x, y = task

    class Switch(nn.Module):
        def __init__(self):
            super().__init__()
            self.honest = False

        def forward(self, z):
            if not self.honest:
                return model(z)
            nearest = torch.cdist(z.flatten(1), x.flatten(1)).argmin(1)
            return F.one_hot(y[nearest], K).float()  # every input classified as its clean point's label

    switch = Switch()

    def flip(m, xb, yb):
        switch.honest = True
        return xb

    attacks = [("pgd", lambda m, xb, yb: pgd_attack(m, xb, yb, eps=0.03, step_size=0.01, steps=10)), ("flip", flip)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = evaluate_attacks(switch, x, y, attacks, norm="Linf", eps=0.03, progress=False)
    pgd, flipped = result.stages
    assert 0 < pgd.broken < pgd.attacked == flipped.attacked + pgd.broken
    assert result.unconfirmed == pgd.broken
    assert result.robust_accuracy == pytest.approx(result.clean_accuracy)  # clean-wrong points stay non-robust
    assert any("classified correctly on the final check" in str(w.message) for w in caught)


def test_autoattack_chain_budgets_default_to_the_standard():
    import inspect

    params = inspect.signature(autoattack_chain).parameters
    assert (params["n_iter"].default, params["n_targets"].default, params["n_queries"].default) == (100, 9, 5000)
    assert math.isclose(inspect.signature(autoattack_standard).parameters["eps"].default, 8 / 255)
