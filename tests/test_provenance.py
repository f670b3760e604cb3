"""Derived outputs name what they were computed from, and readers notice when that no longer holds (issue 28,
item 1): analysis reports, robust-eval entries, figures, seed and study summaries record the run, epoch and
weights checksum; ``Run.analysis``, ``Run.stale_outputs``, robust-eval's report and the study summaries refuse
or flag an output whose weights are not the committed ones. One table of stale and tampered cases."""

from __future__ import annotations

import importlib.util
import json
import math
import re
import shutil
from pathlib import Path

import pytest

from kdcollapse.cli import main
from kdcollapse.config import load_config
from kdcollapse.errors import CheckpointError
from kdcollapse.runs import (Run, RunLock, figure_source, load_model, load_tensors, metrics_source, save_tensors,
                             sealed, source_of, stale_reason)
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


def _edit_json(path: Path, change, *, reseal: bool = False) -> None:
    """Change a derived JSON document; ``reseal``: recompute its content checksum (what kdcollapse itself would
    have written with those values: another run's analysis, an older version's)."""
    document = json.loads(path.read_text())
    change(document)
    if reseal:
        document = {k: sealed(v, k) for k, v in document.items()} if path.name == "robust_eval.json" else \
            sealed(document)
    path.write_text(json.dumps(document))


def _trained_further(run_dir: Path) -> None:
    assert main(["train", "--resume", str(run_dir), "train.epochs=2", "--quiet"]) == 0


def _weights_replaced_by_hand(run_dir: Path) -> None:
    tensors, meta = load_tensors(run_dir / "model.safetensors")
    save_tensors(run_dir / "model.safetensors", {k: v + 1 for k, v in tensors.items()}, meta)


def _checksums(run_dir: Path, change, reseal: bool) -> None:
    _edit_json(run_dir / "analysis_test" / "analysis.json", change, reseal=reseal)
    _edit_json(run_dir / "robust_eval.json", lambda e: [change(v) for v in e.values()], reseal=reseal)


def _values_edited(run_dir: Path) -> None:  # a number changed by hand, the checksums left as they were
    _edit_json(run_dir / "analysis_test" / "analysis.json", lambda r: r["metrics"].update(accuracy=0.99))
    _edit_json(run_dir / "robust_eval.json", lambda e: [v.update(robust_accuracy=0.99) for v in e.values()])


def _unsealed(run_dir: Path) -> None:  # the content checksum removed (or a version before outputs were sealed)
    _checksums(run_dir, lambda r: r.pop("content_sha256"), reseal=False)


def _older_version(run_dir: Path) -> None:  # outputs written before they recorded any checksum
    _checksums(run_dir, lambda r: [r.pop("weights_sha256"), r.pop("content_sha256")], reseal=False)


def _copied_from_another_run(run_dir: Path) -> None:  # the whole analysis of other weights pasted in
    _edit_json(run_dir / "analysis_test" / "analysis.json", lambda r: r.update(epoch=7, weights_sha256="ab" * 32),
               reseal=True)


EDITED, UNSEALED = "edited after it was written", "records no content_sha256"
# case -> (what is done to a copy of the analysed run, the reason the analysis is stale (None: fresh),
#          whether the robust-eval entry is stale too)
CASES = {
    "untouched": (lambda d: None, None, False),
    "trained further (--resume)": (_trained_further, "computed from other weights (epoch 1", True),
    "weights replaced by hand": (_weights_replaced_by_hand, "not the file of epoch 1 that state.json records", True),
    "values edited by hand": (_values_edited, EDITED, True),
    "weights checksums edited": (lambda d: _checksums(d, lambda r: r.update(weights_sha256="0" * 64), False),
                                 EDITED, True),
    "weights checksums edited and resealed": (
        lambda d: _checksums(d, lambda r: r.update(weights_sha256="0" * 64), True), "computed from other weights",
        True),
    "content checksum removed": (_unsealed, UNSEALED, True),
    "written by an older version": (_older_version, UNSEALED, True),
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
    if robust_stale:
        with pytest.raises(CheckpointError, match=r"robust_eval\.json entry .* is stale"):
            run.robust_eval()
        assert all("stale" in e for e in run.robust_eval(stale_ok=True).values())
    else:
        assert all("stale" not in e for e in run.robust_eval().values())
    if case != "weights replaced by hand":  # robust-eval's report marks entries of other weights or edited ones
        from kdcollapse.experiments.robust_eval import markdown_report
        entries = json.loads((run_dir / "robust_eval.json").read_text())
        report = markdown_report("r", entries, run_dir)
        assert ("(stale: other weights)" in report or "(edited or unsealed" in report) == robust_stale


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


def test_analyze_robust_eval_and_plot_into_a_run_in_use_are_refused_and_old_figures_go(analysed, tmp_path):
    run_dir = _copy(analysed, tmp_path)
    lock = RunLock(run_dir)  # a trainer holds the run
    try:
        before = {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()}
        assert main(["analyze", str(run_dir), "--no-progress"]) == 2
        assert main(["robust-eval", str(run_dir), *ROBUST[:-2], "0.2", "--no-progress"]) == 2  # a new entry
        if importlib.util.find_spec("matplotlib"):  # plot needs it
            assert main(["plot", str(run_dir), "--out", str(run_dir / "curves.png")]) == 2
        assert {p: p.read_bytes() for p in run_dir.rglob("*") if p.is_file()} == before  # every writer waits
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
    from kdcollapse.study._records import _moved_on

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


def test_overwrite_removes_every_output_derived_into_the_run_and_keeps_the_users_files(analysed, tmp_path):
    """``analyze --out`` and ``plot --out`` inside a run directory are listed in its ``outputs.json``; they are
    flagged once the run moves on and removed by ``--overwrite`` (issue 28, item 1), the user's own files kept."""
    pytest.importorskip("matplotlib")
    run_dir = _copy(analysed, tmp_path)
    assert main(["plot", str(run_dir), "--out", str(run_dir / "figs" / "curves.png")]) == 0
    assert main(["plot", str(run_dir), "--out", str(run_dir / "c.svg")]) == 0
    assert main(["analyze", str(run_dir), "--out", str(run_dir / "deep" / "er"), "--no-progress"]) == 0
    (run_dir / "mine" / "notes.txt").write_text("the user's\n")
    (run_dir / "notes.md").write_text("the user's\n")
    outside = tmp_path / "outside.txt"
    outside.write_text("not the run's\n")
    listed = json.loads((run_dir / "outputs.json").read_text())
    assert {"figs/curves.png", "c.svg", "deep/er/analysis.json", "deep/er/analysis.md", "deep/er/spectra.png",
            "mine/analysis.json", "analysis_test/analysis.json"} <= set(listed)
    assert Run(run_dir).stale_outputs() == {}
    _trained_further(run_dir)
    stale = Run(run_dir).stale_outputs()
    assert "other records of" in stale["figs/curves.png"] and "other records of" in stale["c.svg"]
    assert "computed from other weights" in stale["deep/er/analysis.json"]
    assert "computed from other weights" in stale["deep/er/spectra.png"]
    _edit_json(run_dir / "outputs.json", lambda o: o.update({"../outside.txt": {"source": {}}}))  # never followed
    assert main(["train", "--config", str(run_dir / "config.yaml"), f"run_dir={run_dir}", "seed=5", "--overwrite",
                 "--quiet"]) == 0
    left = sorted(p.relative_to(run_dir).as_posix() for p in run_dir.rglob("*") if p.is_file())
    assert not [p for p in left if p.startswith(("figs", "deep", "analysis_")) or p in ("c.svg", "outputs.json",
                                                                                      "mine/analysis.json")]
    assert {"mine/notes.txt", "notes.md"} <= set(left) and outside.exists()
    assert Run(run_dir).stale_outputs() == {}


def test_robust_eval_refuses_to_merge_into_an_edited_file(analysed, tmp_path, capsys):
    run_dir = _copy(analysed, tmp_path)
    path = run_dir / "robust_eval.json"
    _edit_json(path, lambda e: [v.update(robust_accuracy=0.99) for v in e.values()])
    before = path.read_bytes()
    capsys.readouterr()
    assert main(["robust-eval", str(run_dir), *ROBUST[:-2], "0.2", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and "edited after it was written" in err, err
    assert path.read_bytes() == before
    with pytest.raises(CheckpointError, match="edited after it was written"):
        Run(run_dir).robust_eval()


def test_a_seal_survives_the_json_round_trip_and_catches_an_edit_or_a_move():
    from kdcollapse.runs import seal_problem

    entry = sealed({"per_class": {2: 0.5, 10: math.nan}, "budget": (1, 2), "robust_accuracy": 0.25}, "pgd last")
    back = json.loads(json.dumps(entry, indent=2))  # int keys become strings, the tuple a list, NaN stays NaN
    assert seal_problem(back, "pgd last") is None
    assert "edited" in seal_problem({**back, "robust_accuracy": 0.26}, "pgd last")
    assert "edited" in seal_problem(back, "pgd best")  # the same entry filed under another key
    assert "records no content_sha256" in seal_problem({k: v for k, v in back.items() if k != "content_sha256"})


def _second_run(analysed: Path, tmp_path: Path) -> Path:
    """Another run of the same config (seed 3): its files are valid kdcollapse files, just not this run's."""
    other = tmp_path / "other"
    fit(load_config(None, [*TINY, f"run_dir={other}", "seed=3"]))
    return other


def _refused(argv, capsys, message):
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err


# name in state.json["files"] -> every reader of it, each called on a run whose file was replaced by another run's
READERS = {
    "model.safetensors": [lambda d, c: pytest.raises(CheckpointError, Run(d).model),
                          lambda d, c: pytest.raises(CheckpointError, load_model, d),
                          lambda d, c: _refused(["analyze", str(d), "--no-progress"], c, "is not the file of epoch 1"),
                          lambda d, c: _refused(["robust-eval", str(d), *ROBUST], c, "is not the file of epoch 1")],
    "best.safetensors": [lambda d, c: pytest.raises(CheckpointError, Run(d).model, "best")],
    "checkpoint.safetensors": [lambda d, c: _refused(["train", "--resume", str(d), "train.epochs=2", "--quiet"], c,
                                                     "not the checkpoint of epoch 1")],
    "metrics.jsonl": [lambda d, c: pytest.raises(CheckpointError, Run(d).metrics),
                      lambda d, c: _refused(["plot", str(d), "--out", str(d.parent / "c.png")], c,
                                            "metrics.jsonl is not the file of epoch 1"),
                      lambda d, c: _refused(["train", "--resume", str(d), "train.epochs=2", "--quiet"], c,
                                            "metrics.jsonl is not the file of epoch 1")],
    "steps.jsonl": [lambda d, c: _refused(["train", "--resume", str(d), "train.epochs=2", "--quiet"], c,
                                          "steps.jsonl is not the file of epoch 1")],
    # no reader: a resume writes it again from metrics.jsonl (verified), which the last line checks
    "metrics.csv": [],
}


def test_every_file_with_a_recorded_checksum_is_verified_by_each_of_its_readers(analysed, tmp_path, capsys):
    """Issue 28, item 1: each file ``state.json`` records, replaced by the same file of another run (valid, only
    not this run's), is refused by every command and API that reads it; a new recorded file fails this test
    until its readers are listed."""
    from kdcollapse.runs import metrics_csv, read_metrics

    other = _second_run(analysed, tmp_path)
    recorded = json.loads((analysed / "state.json").read_text())["files"]
    assert set(READERS) == set(recorded)
    for name, readers in READERS.items():
        run_dir = tmp_path / name.replace(".", "_") / "run"
        shutil.copytree(analysed, run_dir)
        shutil.copy(other / name, run_dir / name)
        for read in readers:
            read(run_dir, capsys)
    run_dir = tmp_path / "metrics_csv" / "run"
    assert main(["train", "--resume", str(run_dir), "train.epochs=2", "--quiet"]) == 0
    assert (run_dir / "metrics.csv").read_text() == metrics_csv(read_metrics(run_dir))
