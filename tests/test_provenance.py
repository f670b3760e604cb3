"""Derived outputs name what they were computed from, and readers notice when that no longer holds (issue 28,
item 1): analysis reports, robust-eval entries, figures, seed and study summaries record the run, epoch and
weights checksum; ``Run.analysis``, ``Run.stale_outputs``, robust-eval's report and the study summaries refuse
or flag an output whose weights are not the committed ones. One table of stale and tampered cases."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from kdcollapse.cli import main
from kdcollapse.config import load_config
from kdcollapse.errors import CheckpointError
from kdcollapse.runs import (Run, RunLock, figure_source, load_tensors, metrics_source, save_tensors, source_of,
                             stale_reason)
from kdcollapse.train import fit

TINY = ["data.name=digits", "data.batch_size=64", "train.progress=false", "optim.lr=0.05", "schedule.name=constant",
        "model.name=mlp", "model.kwargs={input_size: 8, hidden: [16]}", "train.device=cpu", "train.epochs=1"]
ROBUST = ["--attacks", "pgd", "--pgd-steps", "1", "--n-examples", "8", "--eps", "0.1", "--no-progress"]


@pytest.fixture(scope="module")
def analysed(tmp_path_factory):
    """A one-epoch run with ``analysis_test/`` and one robust-eval entry."""
    run_dir = tmp_path_factory.mktemp("prov") / "run"
    fit(load_config(None, [*TINY, f"run_dir={run_dir}"]))
    assert main(["analyze", str(run_dir), "--no-progress"]) == 0
    assert main(["analyze", str(run_dir), "--out", str(run_dir / "mine"), "--no-progress"]) == 0  # another folder
    assert main(["robust-eval", str(run_dir), *ROBUST]) == 0
    return run_dir


def _copy(analysed: Path, tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    shutil.copytree(analysed, run_dir)
    return run_dir


def _edit_json(path: Path, change) -> None:
    document = json.loads(path.read_text())
    change(document)
    path.write_text(json.dumps(document))


def _trained_further(run_dir: Path) -> None:
    assert main(["train", "--resume", str(run_dir), "train.epochs=2", "--quiet"]) == 0


def _weights_replaced_by_hand(run_dir: Path) -> None:
    tensors, meta = load_tensors(run_dir / "model.safetensors")
    save_tensors(run_dir / "model.safetensors", {k: v + 1 for k, v in tensors.items()}, meta)


def _checksum_edited(run_dir: Path) -> None:
    _edit_json(run_dir / "analysis_test" / "analysis.json", lambda r: r.update(weights_sha256="0" * 64))
    _edit_json(run_dir / "robust_eval.json", lambda e: [v.update(weights_sha256="0" * 64) for v in e.values()])


def _older_version(run_dir: Path) -> None:  # outputs written before they recorded a checksum
    _edit_json(run_dir / "analysis_test" / "analysis.json", lambda r: r.pop("weights_sha256"))
    _edit_json(run_dir / "robust_eval.json", lambda e: [v.pop("weights_sha256") for v in e.values()])


def _copied_from_another_run(run_dir: Path) -> None:  # the whole analysis of other weights pasted in
    _edit_json(run_dir / "analysis_test" / "analysis.json", lambda r: r.update(epoch=7, weights_sha256="ab" * 32))


# case -> (what is done to a copy of the analysed run, the reason the analysis is stale (None: fresh),
#          whether the robust-eval entry is stale too)
CASES = {
    "untouched": (lambda d: None, None, False),
    "trained further (--resume)": (_trained_further, "computed from other weights (epoch 1", True),
    "weights replaced by hand": (_weights_replaced_by_hand, "not the file of epoch 1 that state.json records", True),
    "checksums edited": (_checksum_edited, "computed from other weights", True),
    "written by an older version": (_older_version, "records no weights checksum", True),
    "analysis of another run pasted in": (_copied_from_another_run, "other weights (epoch 7", False),
}


@pytest.mark.parametrize("case", CASES)
def test_each_stale_or_tampered_output_is_refused_or_flagged(analysed, tmp_path, case):
    change, reason, robust_stale = CASES[case]
    run_dir = _copy(analysed, tmp_path)
    change(run_dir)
    run = Run(run_dir)
    stale = run.stale_outputs()
    if reason is None:
        assert run.analysis()["weights_sha256"] == source_of(run_dir)["weights_sha256"] and stale == {}
    else:
        expected = rf"analysis\.json is stale: .*{re.escape(reason)}.*kdcollapse analyze"
        with pytest.raises(CheckpointError, match=expected):
            run.analysis()
        assert reason in run.analysis(stale_ok=True)["stale"]
        assert reason in stale["analysis_test/analysis.json"]
    assert any(k.startswith("robust_eval.json: ") for k in stale) == robust_stale
    weights_changed = change in (_trained_further, _weights_replaced_by_hand)
    assert ("mine/analysis.json" in stale) == weights_changed  # an analysis in any folder of the run
    if case != "weights replaced by hand":  # robust-eval's report marks entries of other weights
        from kdcollapse.experiments.robust_eval import markdown_report
        entries = json.loads((run_dir / "robust_eval.json").read_text())
        assert ("(stale: other weights)" in markdown_report("r", entries, run_dir)) == robust_stale


def test_analysis_records_its_source_in_the_report_and_the_figures(analysed):
    report = Run(analysed).analysis()
    source = source_of(analysed)
    assert {k: report[k] for k in source} == source and source["epoch"] == 1
    assert source["weights_sha256"] in json.loads((analysed / "state.json").read_text())["files"][
        "model.safetensors"]["sha256"]
    assert source["weights_sha256"][:16] in (analysed / "analysis_test" / "analysis.md").read_text()
    figure = figure_source(analysed / "analysis_test" / "spectra.png")
    assert figure["weights_sha256"] == source["weights_sha256"] and figure["split"] == "test"
    assert not list((analysed / "analysis_test").glob(".*.tmp"))  # atomic writes leave no temporaries


def test_a_damaged_analysis_is_refused_and_flagged(analysed, tmp_path):
    run_dir = _copy(analysed, tmp_path)
    (run_dir / "analysis_test" / "analysis.json").write_text('{"epoch": 1, "weights')
    with pytest.raises(CheckpointError, match="analysis.json is damaged"):
        Run(run_dir).analysis()
    with pytest.raises(CheckpointError, match=r"analysis_val/analysis\.json not found; run `kdcollapse analyze"):
        Run(run_dir).analysis("val")


def test_analyze_into_a_run_in_use_is_refused_and_old_figures_go(analysed, tmp_path):
    run_dir = _copy(analysed, tmp_path)
    lock = RunLock(run_dir)  # a trainer holds the run
    try:
        before = (run_dir / "analysis_test" / "analysis.json").read_bytes()
        assert main(["analyze", str(run_dir), "--no-progress"]) == 2
        assert (run_dir / "analysis_test" / "analysis.json").read_bytes() == before
    finally:
        lock.release()
    (run_dir / "analysis_test" / "tsne.png").write_bytes(b"an earlier analysis's figure")
    assert main(["analyze", str(run_dir), "--no-progress"]) == 0
    assert not (run_dir / "analysis_test" / "tsne.png").exists()  # not part of this analysis: removed


def test_plot_records_the_runs_it_read(analysed, tmp_path):
    pytest.importorskip("matplotlib")
    out = tmp_path / "curves.png"
    assert main(["plot", str(analysed), "--out", str(out)]) == 0
    (run,) = figure_source(out)["runs"]
    state = json.loads((analysed / "state.json").read_text())
    assert run == {"run_dir": str(analysed), "epoch": 1, "metrics_sha256": state["files"]["metrics.jsonl"]["sha256"],
                   "weights_sha256": state["files"]["model.safetensors"]["sha256"]} == metrics_source(analysed)


def test_a_study_record_of_weights_no_longer_there_is_left_out(analysed, tmp_path):
    from kdcollapse.study._summary import _moved_on

    run_dir = _copy(analysed, tmp_path)
    record = {"best": {}, "last": {}, "source": metrics_source(run_dir)}
    assert not _moved_on(record, run_dir) and not _moved_on({"best": {}}, run_dir)  # older records are kept
    _trained_further(run_dir)
    assert _moved_on(record, run_dir) and not _moved_on(record, tmp_path / "absent")
    assert stale_reason({"weights_sha256": record["source"]["weights_sha256"]}, run_dir)


def test_resume_verifies_the_metrics_it_continues(analysed, tmp_path, capsys):
    run_dir = _copy(analysed, tmp_path)
    path = run_dir / "metrics.jsonl"
    path.write_text(path.read_text().replace('"epoch": 1', '"epoch": 1, "test_acc_edited": 99.9'))
    capsys.readouterr()
    assert main(["train", "--resume", str(run_dir), "train.epochs=2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "metrics.jsonl is not the file of epoch 1 that state.json records" in err and "remove it" in err
    assert "test_acc_edited" in path.read_text()  # refused: nothing re-committed
    path.unlink()  # the way out the message names: continue without the earlier records
    assert main(["train", "--resume", str(run_dir), "train.epochs=2", "--quiet"]) == 0
    assert [r["epoch"] for r in Run(run_dir).metrics()] == [2]
