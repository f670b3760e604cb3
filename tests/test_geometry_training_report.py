"""`kdcollapse geometry heads-report` (the class-assignment runs) on tiny digits runs: tables, arrangements, figures."""

import json
import math
import re

import pytest
import torch

from kdcollapse.cli import main
from kdcollapse.config import load_config
from kdcollapse.errors import KdcollapseError
from kdcollapse.experiments.heads_report import circular_order, opposite_pairs
from kdcollapse.train import fit
from kdcollapse.runs import read_metrics

COMMON = ["data.name=digits", "data.batch_size=60", "data.train_per_class=12", "train.progress=false",
          "schedule.name=constant", "train.epochs=1", "model.name=mlp", "method.name=spherical"]


def train(run_dir, *extra):
    return fit(load_config(None, [*COMMON, f"run_dir={run_dir}", *extra])).run_dir


def unit(degrees):
    return torch.tensor([[math.cos(math.radians(a)), math.sin(math.radians(a))] for a in degrees])


def test_circular_order_and_opposite_pairs():
    W = unit([100, -10, 200, 80])  # counter-clockwise from -180: class 2 (200 = -160), 1, 3, 0
    assert circular_order(W) == [2, 1, 3, 0]
    assert opposite_pairs(W) == {frozenset({2, 3}), frozenset({1, 0})}
    with pytest.raises(KdcollapseError, match="4 class vectors in d = 2"):
        opposite_pairs(unit([0, 90, 180]))


def test_heads_report_on_tiny_runs(tmp_path, capsys):
    runs, out = tmp_path / "runs", tmp_path / "out"
    flat = ["model.kwargs={input_size: 8, hidden: [32], bottleneck: 2}", "data.classes=[0, 1, 2, 3]",
            "data.train_per_class=15"]
    train(runs / "assignment" / "trainable" / "seed0", *flat, "method.head=cosine")
    for name, assignment in (("A1", "[0, 1, 2, 3]"), ("A3", "[0, 2, 1, 3]")):
        train(runs / "assignment" / name / "seed0", *flat, "method.head=fixed", "method.code=softmax",
              f"method.assignment={assignment}")

    assert main(["geometry", "heads-report", "--runs", str(runs), "--out", str(out)]) == 0
    assert "wrote" in capsys.readouterr().out
    assert not (out / "heads.md").exists()  # the heads of Fig. 5 are a study (results/geometry/heads/study.yaml)
    assignment = (out / "assignment.md").read_text()
    rows = {m[0]: m[1] for m in re.findall(r"^\| (\w+) \| [^|]+ \| ([^|]+) \|", assignment, re.M)}
    assert rows["A1"].strip() == "0 / 2, 1 / 3 (= A1)"
    assert rows["A3"].strip() == "0 / 1, 2 / 3 (= A3)"
    assert re.fullmatch(r"0 / \d, \d / \d( \(= A\d\))?", rows["trainable"].strip())
    assert "GNC2" in assignment and "seed 0: " in assignment
    assert assignment.index("| trainable | learned |") < assignment.index("| A1 |")  # the page's order
    for name in ("A1", "A3"):
        acc = read_metrics(runs / "assignment" / name / "seed0")[-1]["test_acc"]
        assert re.search(rf"^\| {name} \| [^\n]* \| {acc:.2f} \| {acc:.2f} ± 0.00 \|$", assignment, re.M)
    for figure in ("assignment_features.png", "assignment_trainable_seeds.png"):
        assert (out / figure).stat().st_size > 10_000

    # Every run measured is named with its committed epoch and weights checksum (issue 28, item 1).
    from kdcollapse.runs import metrics_source
    assert f"`A3/seed0`: epoch 1, weights `{metrics_source(runs / 'assignment' / 'A3' / 'seed0')['weights_sha256'][:16]}`" \
        in assignment

    # The header names the code revision each run recorded, and says when a run recorded none.
    info_path = runs / "assignment" / "A1" / "seed0" / "run.json"
    info = json.loads(info_path.read_text())
    assert f"(run.json): {info['git_revision'] or 'not recorded'}" in assignment
    info_path.write_text(json.dumps({**info, "git_revision": None}))
    assert main(["geometry", "heads-report", "--runs", str(runs), "--out", str(out)]) == 0
    assert "not recorded (run outside a git checkout)" in (out / "assignment.md").read_text()

    assert main(["geometry", "heads-report", "--runs", str(tmp_path / "out"), "--out", str(tmp_path / "x")]) == 2
    assert "holds no assignment/" in capsys.readouterr().err
