"""The demo's whole pipeline (train, distil, analyse, report) on digits, with one epoch per run."""

import dataclasses

from kdcollapse.errors import DataError
from kdcollapse.experiments import demo


def test_demo_pipeline_writes_the_report(tmp_path, monkeypatch, capsys):
    quick = dataclasses.replace(demo.PLANS["digits"], teacher_epochs=1, student_epochs=1)
    monkeypatch.setitem(demo.PLANS, "digits", quick)
    report = demo.run_demo(tmp_path, "digits")
    text = report.read_text()
    out = capsys.readouterr().out
    assert "demo on digits; runs in" in out
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
