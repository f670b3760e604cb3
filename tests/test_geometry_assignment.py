"""The class-assignment page's measurement (the study post step ``circle_geometry``) on tiny digits runs: the angle
between the rows of each similar pair (classes 2i, 2i + 1) on the square, for fixed and trainable heads."""

import pytest

from kdcollapse.config import load_config
from kdcollapse.experiments.gnc_networks import circle_geometry
from kdcollapse.train import fit

FLAT = ["data.name=digits", "data.batch_size=60", "data.train_per_class=15", "train.progress=false",
        "schedule.name=constant", "train.epochs=1", "model.name=mlp", "method.name=spherical",
        "model.kwargs={input_size: 8, hidden: [32], bottleneck: 2}", "data.classes=[0, 1, 2, 3]"]


def train(run_dir, *extra):
    return fit(load_config(None, [*FLAT, f"run_dir={run_dir}", *extra])).run_dir


@pytest.mark.parametrize("assignment, angles", [("[0, 1, 2, 3]", (90, 90)), ("[0, 1, 3, 2]", (90, 90)),
                                                ("[0, 2, 1, 3]", (180, 180))])
def test_pair_angles_of_the_fixed_squares(tmp_path, assignment, angles):
    # class c on row assignment[c] of the square (rows at 0, 90, 180, 270 degrees): A1 and A2 put each pair on
    # adjacent corners, A3 on opposite ones
    row = circle_geometry(train(tmp_path / "run", "method.head=fixed", "method.code=softmax",
                                f"method.assignment={assignment}"))
    assert (row["pair_angle_min_deg"], row["pair_angle_max_deg"]) == pytest.approx(angles, abs=1e-6)
    assert row["w_gap_min"] == pytest.approx(1.0) and row["w_gap_max"] == pytest.approx(1.0)  # evenly spaced


def test_pair_angles_of_a_trainable_head_are_its_rows(tmp_path):
    import math

    import torch

    from kdcollapse.runs import Run

    run_dir = train(tmp_path / "run", "method.head=cosine")
    model, _ = Run(run_dir).model("model")
    w = torch.nn.functional.normalize(model.head.weight.detach().double(), dim=1)
    pairs = [math.degrees(math.acos(float(w[a] @ w[a + 1]))) for a in (0, 2)]
    row = circle_geometry(run_dir)
    assert (row["pair_angle_min_deg"], row["pair_angle_max_deg"]) == pytest.approx((min(pairs), max(pairs)))
