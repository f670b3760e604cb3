"""``kdcollapse.runs``: a run directory opened as training saw it, and the ``data.classes`` regression through
every command that reads a run (analyze, robust-eval, the heads report, ``Run`` itself)."""

import hashlib
import json

import pytest
import torch

from kdcollapse.cli import main
from kdcollapse.errors import CheckpointError
from kdcollapse.runs import Run, run_dataset
from kdcollapse.train import Trainer, fit

CLASSES = [1, 3, 5, 7]
SUBSET = ["data.batch_size=32", "train.epochs=1", f"data.classes={CLASSES}"]  # on top of the tiny run


@pytest.fixture(scope="module")
def subset_run(tmp_path_factory, tiny_config):
    run_dir = tmp_path_factory.mktemp("runs") / "heads" / "linear" / "seed0"
    fit(tiny_config(run_dir, *SUBSET))
    return run_dir


def test_run_gives_the_data_the_trainer_saw(subset_run, tmp_path, tiny_config):
    run = Run(subset_run)
    cfg = tiny_config(tmp_path / "again", *SUBSET)
    trainer = Trainer(cfg)
    for split, seen in (("train", trainer.train_set), ("test", trainer.test_set)):
        mine = run.dataset(split)
        assert mine.num_classes == len(CLASSES) == seen.num_classes
        assert torch.equal(mine.inputs, seen.inputs) and torch.equal(mine.labels, seen.labels)
        assert sorted(mine.labels.unique().tolist()) == [0, 1, 2, 3]  # relabelled in the order given
    assert torch.equal(run_dataset(cfg, "test", per_class=3).labels.bincount(), torch.full((4,), 3))


def test_run_model_teacher_heads_and_metrics(subset_run):
    run = Run(subset_run)
    model, meta = run.model()
    assert model.num_classes == 4 and meta["epoch"] == 1
    best, _ = run.model("best")
    assert best.num_classes == 4
    assert run.teacher() is None and run.heads(model, meta) == {}
    assert [r["epoch"] for r in run.metrics()] == [1]
    assert run.finished()
    with pytest.raises(Exception, match="unknown model file 'last'.*model, best"):
        run.model("last")


def test_run_refuses_what_is_not_a_run(tmp_path):
    with pytest.raises(CheckpointError, match="run directory not found"):
        Run(tmp_path / "nowhere")
    with pytest.raises(CheckpointError, match="holds no config.yaml"):
        Run(tmp_path)


def test_analyze_a_run_trained_on_a_subset_of_classes(subset_run, tmp_path, capsys):
    out = tmp_path / "analysis"
    assert main(["analyze", str(subset_run), "--split", "test", "--out", str(out), "--no-progress",
                 "--tsne-per-class", "0"]) == 0
    metrics = json.loads((out / "analysis.json").read_text())
    assert metrics["num_classes"] == 4 and metrics["num_samples"] == 40


def test_robust_eval_a_run_trained_on_a_subset_of_classes(subset_run, capsys):
    assert main(["robust-eval", str(subset_run), "--eps", "0.1", "--attacks", "pgd", "--pgd-steps", "2",
                 "--no-progress"]) == 0
    entry = json.loads((subset_run / "robust_eval.json").read_text())["pgd-2 Linf eps=0.1 last"]
    assert entry["examples"] == "first 40 test images"  # 4 classes x 10: the run's test set, not the whole split


def test_gnc_post_steps_see_a_run_trained_on_a_subset_of_classes(subset_run):
    from kdcollapse.experiments.gnc_networks import outputs

    model, train, h, _ = outputs(Run(subset_run))
    assert model.num_classes == train.num_classes == 4 and sorted(train.labels.unique().tolist()) == [0, 1, 2, 3]
    assert h.shape == (len(train.labels), 16)


def test_run_gives_the_validation_split_the_trainer_saw(tmp_path, tiny_config):
    cfg = tiny_config(tmp_path / "val", *SUBSET, "data.val_per_class=5")
    trainer = Trainer(cfg)
    val = run_dataset(cfg, "val")
    assert torch.equal(val.inputs, trainer.val_set.inputs) and torch.equal(val.labels, trainer.val_set.labels)
    assert val.labels.bincount().tolist() == [5, 5, 5, 5]
    with pytest.raises(Exception, match="no validation split"):
        run_dataset(tiny_config(tmp_path / "none", *SUBSET), "val")


def test_an_interrupted_run_is_not_finished(subset_run, tmp_path):
    import shutil

    copy = tmp_path / "interrupted"
    shutil.copytree(subset_run, copy)
    config = copy / "config.yaml"
    config.write_text(config.read_text().replace("epochs: 1\n", "epochs: 3\n"))
    record = json.loads((copy / "run.json").read_text())  # a run of 3 epochs (its record too) that stopped at 1
    record["config_sha256"] = hashlib.sha256(config.read_bytes()).hexdigest()
    (copy / "run.json").write_text(json.dumps(record))
    assert Run(subset_run).finished() and not Run(copy).finished()
    (copy / "metrics.jsonl").unlink()
    assert not Run(copy).finished()
