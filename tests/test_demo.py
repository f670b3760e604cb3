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


def test_demo_on_a_core_install_skips_figures_and_tsne_in_one_line(tmp_path, monkeypatch, capsys):
    """No matplotlib, no scikit-learn (the core install): the digits ship with the package, the demo runs and
    says in one line what it skipped; the report's sentence on KD follows its own numbers."""
    import sys

    for name in ("matplotlib", "matplotlib.pyplot", "sklearn", "sklearn.manifold", "sklearn.datasets"):
        monkeypatch.setitem(sys.modules, name, None)
    plan = demo.PLANS["digits"]
    tiny = dataclasses.replace(plan, quick_teacher_epochs=1, student_epochs=2,
                               overrides=(*plan.overrides, "data.test_per_class=10"))
    monkeypatch.setitem(demo.PLANS, "digits", tiny)
    assert main(["demo", "--quick", "--out", str(tmp_path), "--data", "digits", "--quiet"]) == 0
    out = capsys.readouterr().out
    skipped = [line for line in out.splitlines() if "skipped:" in line]
    assert len(skipped) == 1 and "matplotlib and scikit-learn not installed" in skipped[0], out
    assert not (tmp_path / "curves.png").exists()
    text = (tmp_path / "report.md").read_text()
    assert "Skipped: figures and t-SNE" in text and "![training curves]" not in text
    results = text.split("## Collapse")[0]  # the results table, before the collapse table
    rows = {line.split("|")[1].strip(): line.split("|") for line in results.splitlines() if line.startswith("| ")}
    gain = float(rows["kd"][7]) - float(rows["student"][7])
    assert (f"beats the student alone by {gain:.2f}" if gain > 0 else "does not beat the student alone") in text


def test_the_kd_sentence_follows_the_numbers():
    assert demo.kd_verdict({"student": 80.0, "kd": 81.5}, "digits").startswith("KD beats the student alone by 1.50")
    worse = demo.kd_verdict({"student": 80.0, "kd": 79.0}, "fashion_mnist")
    assert worse.startswith("KD does not beat the student alone in this run (-1.00 points")
    assert demo.kd_verdict({"student": 80.0}, "digits") == ""
