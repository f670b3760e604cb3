"""The demo's whole pipeline (train, distil, analyse, report) on digits, with one or two epochs per run,
through the command line: its report and the progress it shows."""

import dataclasses

from kdcollapse.cli import main
from kdcollapse.errors import DataError
from kdcollapse.experiments import demo


def test_demo_pipeline_writes_the_report(tmp_path, monkeypatch, capsys):
    plan = demo.PLANS["digits"]  # on a tenth of the digits (its 5 runs' figures and t-SNE cost the most)
    quick = dataclasses.replace(plan, teacher_epochs=1, student_epochs=2,
                                overrides=(*plan.overrides, "data.train_per_class=20", "data.test_per_class=10"))
    monkeypatch.setitem(demo.PLANS, "digits", quick)
    assert main(["demo", "--out", str(tmp_path), "--data", "digits"]) == 0
    text = (tmp_path / "report.md").read_text()
    out, err = capsys.readouterr()
    assert "demo on digits; runs in" in out
    # progress while it runs: which stage, then the trainer's line per epoch
    progress = [" ".join(line.split()[:3 if line.startswith("[") else 2]) for line in err.splitlines()
                if line.startswith(("[", "epoch "))]
    assert progress[:7] == ["[1/5] teacher: training", "epoch 1/1", "[1/5] teacher: analysing",
                            "[2/5] student: training", "epoch 1/2", "epoch 2/2", "[2/5] student: analysing"]
    assert progress[-1] == "[5/5] ikl_kd: analysing"
    for run in ("teacher", "student", "kd", "dhkd", "ikl_kd"):
        assert f"| {run} |" in text
    assert (tmp_path / "curves.png").stat().st_size > 0
    assert (tmp_path / "student_dhkd" / "analysis_test" / "analysis.json").is_file()
    assert "## Collapse of the test features" in text


def test_demo_prefers_fashion_mnist_when_it_loads(monkeypatch):
    monkeypatch.setattr(demo, "load_dataset", lambda name, split: object())
    assert demo.choose_dataset() == "fashion_mnist"

    def absent(name, split):
        raise DataError(f"dataset {name!r} not found")

    monkeypatch.setattr(demo, "load_dataset", absent)
    assert demo.choose_dataset() == "digits"
    assert demo.choose_dataset("fashion_mnist") == "fashion_mnist"  # a requested dataset is never second-guessed


def test_the_command_offers_exactly_the_demo_plans():
    from kdcollapse.cli.demo import DATASETS

    assert sorted(DATASETS) == sorted(demo.PLANS)
