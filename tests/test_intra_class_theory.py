"""Theorems 1-2 of the intra-class contrastive KD paper (§4.2) checked numerically on synthetic embeddings
(the constructions: ``kdcollapse.experiments.intra_class_theory``)."""

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from kdcollapse.errors import ConfigError
from kdcollapse.experiments import intra_class_theory as theory
from kdcollapse.experiments.intra_class_theory import minimise_eq_9, sphere_classes, tuplet_loss
from kdcollapse.losses import validation


@pytest.mark.parametrize("ratio", [2, 5])
def test_theorem_1_loss_ratio_tends_to_the_distance_ratio(ratio):
    # For one anchor x with positive x⁺, m same-class and n = ratio·m other-class negatives:
    # ratio · e^{L_Intra} / e^{L_Inter} → d_Intra(x) / d_Inter(x) as m → ∞ (d: E exp(φ(x)ᵀφ(x⁻))).
    g = torch.Generator().manual_seed(ratio)
    phi, labels = sphere_classes(6, 40_000, 8, spread=0.6, generator=g)
    anchor = phi[0]
    positive = F.normalize(anchor + 0.1 * torch.randn(8, generator=g, dtype=torch.float64), dim=0)
    same, other = phi[1:][labels[1:] == 0], phi[labels != 0]
    other = other[torch.randperm(len(other), generator=g)]  # negatives are drawn from all other classes
    d_intra, d_inter = (same @ anchor).exp().mean().item(), (other @ anchor).exp().mean().item()
    errors = []
    for m in (2, 200, 20_000):
        l_intra = tuplet_loss(anchor, positive, same[:m])
        l_inter = tuplet_loss(anchor, positive, other[: ratio * m])
        predicted = ratio * math.exp(l_intra - l_inter)
        errors.append(abs(predicted / (d_intra / d_inter) - 1))
    assert errors[2] < 0.02, errors  # the limit holds ...
    assert errors[0] > 5 * errors[2], errors  # ... and is a limit: small m is visibly off


def test_theorem_2_ratio_falls_as_lambda_grows():
    # Theorem 2: 1/(C0·λ + C1) <= L_Intra/L_Inter <= C2/λ + C3 at the minimiser, constants unstated. With
    # constants unknown the checkable content is the trend: the ratio falls as λ grows, and λ·ratio does
    # not vanish (the lower bound decays no faster than 1/λ).
    lambdas = (0.1, 1.0, 10.0)
    for seed in (0, 1):
        with validation(False):  # 1,800 small steps: the loss's input checks would double their cost
            ratios = [i / e for i, e in (minimise_eq_9(lam, seed) for lam in lambdas)]
        assert ratios[0] > ratios[1] > ratios[2], ratios
        assert min(lam * r for lam, r in zip(lambdas, ratios)) > 0.05, ratios


# The page results/intra_class/theorems/README.md: its tables generated from the records, checked by `make pages`.
ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "results/intra_class/theorems"


def fake_records(bump=1.2):
    errors = [{"K": k, "seed": s, "m": m, "error": (k + s) / m - 0.01 * (s == 2)} for k in (2, 5) for s in (0, 1, 2)
              for m in (1, 10, 1000)]
    losses = [{"seed": s, "lambda": lam, "l_intra": 2.0 / (1 + lam) + (bump if (s, lam) == (1, 10.0) else 0),
               "l_inter": 2.0} for s in (0, 1) for lam in (0.1, 1.0, 10.0)]
    return {"theorem_1": errors, "theorem_1_by_class": [{**r, "error": 0.1} for r in errors], "theorem_2": losses,
            "machine": "a test CPU"}


def test_the_page_block_is_computed_from_the_records():
    text = theory.page_text(fake_records())
    assert "Computed on a test CPU." in text
    assert "| 5 | 1 | +6.000 | +0.600 | +0.006 |" in text  # (K + seed) / m at each m
    assert "| 1,000 | -0.006 | +0.006 | 0.006 | 0.100 |" in text  # min, max, largest |error| over K and seeds
    # the ratio is 1/(1 + λ), except seed 1 at λ = 10: (2/11 + 1.2)/2
    assert "| 10 | 0.091 (0.182 / 2.000) | 0.691 (1.382 / 2.000) | 0.091 to 0.691 |" in text
    assert "The largest rise of the ratio from one λ to the next, over seeds: +0.1909 (seed 1, λ = 1 → 10)." in text
    assert "does not rise from one λ to the next on any seed" in theory.page_text(fake_records(bump=0.0))


def test_write_page_writes_checks_and_refuses_a_page_without_markers(tmp_path):
    (tmp_path / "README.md").write_text(f"# t\n\nprose\n\n{theory.BEGIN}\nold\n{theory.END}\n\nmore prose\n")
    assert theory.write_page(tmp_path, data=fake_records()) == [tmp_path / "results.json", tmp_path / "README.md"]
    page = (tmp_path / "README.md").read_text()
    assert page.startswith("# t\n\nprose\n\n") and page.endswith(f"{theory.END}\n\nmore prose\n") and "old" not in page
    assert theory.main(["--check", str(tmp_path)]) == 0
    (tmp_path / "README.md").write_text(page.replace("+6.000", "+6.001"))  # a hand edit of a generated number
    assert theory.main(["--check", str(tmp_path)]) == 1
    assert (tmp_path / "README.md").read_text() == page.replace("+6.000", "+6.001")  # --check writes nothing
    (tmp_path / "README.md").write_text("no markers\n")
    with pytest.raises(ConfigError, match="no intra-class theorems markers"):
        theory.write_page(tmp_path, data=fake_records())
    assert (tmp_path / "README.md").read_text() == "no markers\n"
    assert theory.main(["--check", str(tmp_path / "missing")]) == 2


def test_the_committed_page_is_what_its_records_give():
    assert theory.write_page(PAGE, check=True) == [], \
        "run `python -m kdcollapse.experiments.intra_class_theory results/intra_class/theorems`"


def test_theorem_1_by_class_sees_the_same_anchor():
    # the two variants differ only in the order of the other-class negatives; at m = 30,000 with K = 5 both use
    # 150,000 of the 200,000 others, so their errors differ, while small-m errors use other negatives
    shuffled, by_class = theory.theorem_1(5, 0), theory.theorem_1(5, 0, by_class=True)
    assert [m for m, _ in shuffled] == [m for m, _ in by_class] == list(theory.SIZES)
    assert shuffled[-1][1] != by_class[-1][1]
