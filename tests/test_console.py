"""What a run says and writes as it goes: one line per epoch (console and `logging`), `--quiet`,
`metrics.csv`, the t-SNE stage of `analyze`, and `--seeds` that never mixes runs of different configs."""

import csv
import io
import json
import logging
import threading

import pytest
from tqdm import tqdm

from kdcollapse.analysis import _analyze
from kdcollapse.cli import main
from kdcollapse.errors import ConfigError
from kdcollapse.config import load_config
from kdcollapse.runs import check_same_config, metrics_csv, read_metrics
from kdcollapse.runs._lock import RunLock
from kdcollapse.train import fit
from naming import raises_naming


@pytest.fixture
def train(tmp_path, tiny_overrides):
    """``train(*args)``: ``kdcollapse train`` of the tiny run (no progress bar) from an empty config."""
    config = tmp_path / "empty.yaml"
    config.write_text("{}\n")
    return lambda *args: main(["train", "--config", str(config), *tiny_overrides, *map(str, args)])


def test_one_line_per_epoch_on_the_console_and_through_logging(train, tmp_path, capsys, caplog):
    caplog.set_level(logging.INFO, logger="kdcollapse")
    assert train(f"run_dir={tmp_path / 'r'}", "train.epochs=3", "train.eval_every=2") == 0
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.startswith("epoch ")]
    assert [line.split()[1] for line in lines] == ["1/3", "2/3", "3/3"]  # train.progress=false: lines still
    assert "test" not in lines[0] and " test " in lines[1]  # accuracies of evaluated epochs only
    for word in ("loss", "train", "lr", "img/s"):
        assert f" {word} " in lines[2]
    assert lines[2].endswith(" s") and "best test accuracy" in out
    records = [r for r in caplog.records if r.name == "kdcollapse.train"]
    assert [r.getMessage() for r in records] == lines
    assert records[-1].metrics == read_metrics(tmp_path / "r")[-1]  # the whole metrics.jsonl record
    assert logging.getLogger("kdcollapse").handlers == [h for h in logging.getLogger("kdcollapse").handlers
                                                        if isinstance(h, logging.NullHandler)]  # CLI's removed


def test_the_library_prints_nothing_unless_logging_is_configured(tiny_config, tmp_path, capsys):
    fit(tiny_config(tmp_path / "lib", "train.epochs=1"))
    assert capsys.readouterr().err == ""


def test_quiet_prints_the_result_only(train, tmp_path, capsys):
    assert train(f"run_dir={tmp_path / 'q'}", "train.epochs=2", "train.progress=true", "--quiet") == 0
    out, err = capsys.readouterr()
    assert err == "" and "best test accuracy" in out
    assert load_config(tmp_path / "q" / "config.yaml").train.progress is False


def test_metrics_csv_holds_every_record_and_the_union_of_keys(tiny_config, tmp_path):
    run_dir = tmp_path / "c"
    fit(tiny_config(run_dir, "train.epochs=3", "train.eval_every=2"))
    records = read_metrics(run_dir)
    rows = list(csv.DictReader(io.StringIO((run_dir / "metrics.csv").read_text())))
    assert list(rows[0]) == list(dict.fromkeys(k for r in records for k in r))  # epoch 1 lacks test_acc
    assert [row["test_acc"] for row in rows][0] == "" and float(rows[1]["test_acc"]) == records[1]["test_acc"]
    assert [float(row["train_loss"]) for row in rows] == [r["train_loss"] for r in records]  # exact: repr
    assert rows[1]["selected_on"] == "test"
    assert "metrics.csv" in json.loads((run_dir / "state.json").read_text())["files"]  # in the epoch commit


def test_a_resume_rederives_metrics_csv_from_metrics_jsonl(tiny_config, tmp_path):
    run_dir = tmp_path / "r"
    fit(tiny_config(run_dir, "train.epochs=2"))
    (run_dir / "metrics.csv").write_text("torn")  # a run of an older version, or a damaged file
    fit(tiny_config(run_dir, "train.epochs=2"), resume=True)  # nothing left to train: still re-derived
    assert (run_dir / "metrics.csv").read_text() == metrics_csv(read_metrics(run_dir))
    fit(tiny_config(run_dir, "train.epochs=3"), resume=True)
    assert (run_dir / "metrics.csv").read_text() == metrics_csv(read_metrics(run_dir))
    assert len(read_metrics(run_dir)) == 3


def test_tsne_runs_inside_a_visible_stage_of_analyze(tiny_config, tmp_path, capsys, monkeypatch):
    fit(tiny_config(tmp_path / "a", "train.epochs=1"))
    seen = []

    def slow_tsne(features, seed):  # the real one, and time for the stage to tick at least once
        open_bars = [bar.desc for bar in list(tqdm._instances) if not bar.disable]
        threading.Event().wait(1.2)
        seen.append(open_bars)
        return tsne(features, seed)

    tsne = _analyze.tsne
    monkeypatch.setattr(_analyze, "tsne", slow_tsne)
    assert main(["analyze", str(tmp_path / "a"), "--out", str(tmp_path / "out"), "--tsne-per-class", "5"]) == 0
    assert seen == [["t-SNE of 50 points"]]
    err = capsys.readouterr().err
    assert "t-SNE of 50 points: 00:00" in err and "t-SNE of 50 points: 00:01" in err  # it ticks while it runs
    assert (tmp_path / "out" / "tsne.png").is_file()


def test_seeds_refuse_a_run_dir_holding_another_config(train, tmp_path, capsys):
    assert train(f"run_dir={tmp_path / 's'}", "train.epochs=1", "--seeds", "0") == 0
    capsys.readouterr()
    assert train(f"run_dir={tmp_path / 's'}", "train.epochs=1", "optim.lr=0.1", "--seeds", "1,0") == 2
    err = capsys.readouterr().err
    assert "seed0 already holds a run of another config (optim.lr=0.05 there, 0.1 here)" in err
    assert "--overwrite" in err and not (tmp_path / "s" / "seed1").exists()  # refused before seed 1 started
    assert train(f"run_dir={tmp_path / 's'}", "train.epochs=1", "optim.lr=0.1", "--seeds", "1,0", "--overwrite") == 0
    assert load_config(tmp_path / "s" / "seed0" / "config.yaml").optim.lr == 0.1


def test_seeds_name_the_seed_directory_to_resume(train, tmp_path, capsys):
    """--resume takes one run directory, never a series: a seed that already ran is named for it."""
    assert train(f"run_dir={tmp_path / 's'}", "train.epochs=1", "--seeds", "0") == 0
    capsys.readouterr()
    assert train(f"run_dir={tmp_path / 's'}", "train.epochs=1", "--seeds", "1,0") == 2
    assert f"continue it with `--resume {tmp_path / 's' / 'seed0'}`" in capsys.readouterr().err
    assert not (tmp_path / "s" / "seed1").exists()


def test_seeds_overwrite_checks_every_seed_directory_before_the_first_trains(train, tmp_path, capsys):
    assert train(f"run_dir={tmp_path / 's'}", "train.epochs=1", "--seeds", "0,1") == 0
    before = (tmp_path / "s" / "seed0" / "metrics.jsonl").read_text()
    capsys.readouterr()
    lock = RunLock(tmp_path / "s" / "seed1")  # another process is training into seed 1
    try:
        assert train(f"run_dir={tmp_path / 's'}", "train.epochs=1", "--seeds", "0,1", "--overwrite") == 2
    finally:
        lock.release()
    assert "seed1 is in use by another process" in capsys.readouterr().err
    # seed 1 holds the teacher of this series: --overwrite would delete it
    assert train("method.name=kd", f"teacher.checkpoint={tmp_path / 's' / 'seed1'}", f"run_dir={tmp_path / 's'}",
                 "train.epochs=1", "--seeds", "0,1", "--overwrite") == 2
    assert "seed1, which holds this run's teacher" in capsys.readouterr().err
    assert (tmp_path / "s" / "seed0" / "metrics.jsonl").read_text() == before  # seed 0 was never retrained


def test_a_summary_refuses_runs_of_different_configs(tiny_config, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    fit(tiny_config(a, "train.epochs=1"))
    fit(tiny_config(b, "train.epochs=2", "seed=1"))  # epochs and seed may differ
    check_same_config([a, b])
    c = tmp_path / "c"
    fit(tiny_config(c, "train.epochs=1", "optim.lr=0.1"))
    with raises_naming(ConfigError, "optim.lr=0.05", "optim.lr", "0.1", str(c)):
        check_same_config([a, b, c])
