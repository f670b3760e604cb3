"""The validation split (``data.val_per_class``): carved from the training split with the run's seed,
disjoint from the training subset, evaluated unaugmented, and the split that selects "best"."""

import json
from pathlib import Path

import pytest
import torch

from kdcollapse.config import load_config
from kdcollapse.data import TensorDataset, load_dataset, split_validation
from kdcollapse.errors import ConfigError, DataError
from kdcollapse.train import fit
from kdcollapse.runs import load_tensors
from kdcollapse.train._trainer import Trainer
from kdcollapse.cli.train import _report

TINY = ["data.name=digits", "data.batch_size=64", "train.progress=false", "optim.lr=0.05",
        "schedule.name=constant", "model.name=mlp", "model.kwargs={input_size: 8, hidden: [16]}"]


def numbered(counts):
    """A vector dataset whose single feature is the sample's own index, so splits can be traced back."""
    labels = torch.cat([torch.full((n,), k) for k, n in enumerate(counts)])
    labels = labels[torch.randperm(len(labels), generator=torch.Generator().manual_seed(1))]
    inputs = torch.arange(len(labels), dtype=torch.float32)[:, None]
    return TensorDataset(inputs, labels, [f"c{k}" for k in range(len(counts))], (0.0,), (1.0,), "numbered")


def ids(dataset):
    return set(dataset.inputs[:, 0].long().tolist())


def test_split_is_disjoint_complete_balanced_and_ordered():
    data = numbered([30, 25, 40])
    train, val = split_validation(data, 7, seed=3)
    assert ids(train).isdisjoint(ids(val)) and ids(train) | ids(val) == ids(data)
    assert torch.bincount(val.labels).tolist() == [7, 7, 7]
    assert torch.bincount(train.labels).tolist() == [23, 18, 33]
    for part in (train, val):  # original order kept, labels travel with their samples
        assert torch.equal(part.inputs[:, 0], part.inputs[:, 0].sort().values)
        assert torch.equal(part.labels, data.labels[part.inputs[:, 0].long()])


def test_split_is_deterministic_per_seed():
    data = numbered([30, 25, 40])
    assert ids(split_validation(data, 5, seed=0)[1]) == ids(split_validation(data, 5, seed=0)[1])
    assert ids(split_validation(data, 5, seed=0)[1]) != ids(split_validation(data, 5, seed=1)[1])


def test_zero_means_no_split_and_bad_sizes_are_refused():
    data = numbered([10, 10])
    assert split_validation(data, 0, seed=0) == (data, None)
    with pytest.raises(DataError, match="leaves no training sample.*at most 9"):
        split_validation(data, 10, seed=0)
    with pytest.raises(DataError, match="val_per_class must be an int >= 0"):
        split_validation(data, -1, seed=0)
    with pytest.raises(ConfigError, match="data.val_per_class must be >= 0"):
        load_config(None, ["data.val_per_class=-2"])


def test_trainer_carves_val_before_the_classes_subset_and_train_per_class(tmp_path):
    cfg = load_config(None, [*TINY, f"run_dir={tmp_path}", "data.classes=[7, 2, 5]", "data.val_per_class=6",
                             "data.train_per_class=20", "data.crop_padding=1", "data.flip=true"])
    trainer = Trainer(cfg)
    train, val = trainer.train_set, trainer.val_set
    assert train.classes == val.classes == ["7", "2", "5"]
    assert torch.bincount(val.labels).tolist() == [6] * 3 and torch.bincount(train.labels).tolist() == [20] * 3
    # The trainer's split is split_validation's, and the training subset is drawn from its remainder.
    expected_train, expected_val = split_validation(load_dataset("digits", "train").select_classes([7, 2, 5]), 6,
                                                    cfg.seed)
    assert torch.equal(val.inputs, expected_val.inputs)
    assert torch.equal(train.inputs, expected_train.subset(20, seed=cfg.seed).inputs)
    # Validation is evaluated like the test set: in order, no crop, no flip.
    assert not trainer.val_loader.train and not trainer.val_loader.augment.active
    assert trainer.train_loader.augment.active


def test_best_is_selected_on_validation_and_recorded(tmp_path, capsys):
    cfg = load_config(None, [*TINY, f"run_dir={tmp_path}", "train.epochs=4", "data.val_per_class=30",
                             "data.train_per_class=40"])
    result = fit(cfg)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all({"val_acc", "val_loss", "test_acc"} <= r.keys() and r["selected_on"] == "val" for r in records)
    val = [r["val_acc"] for r in records]
    best = val.index(max(val))  # the first epoch reaching the maximum
    assert result.selected_on == "val" and result.best_epoch == best + 1
    assert result.best_val_acc == val[best] and result.best_acc == records[best]["test_acc"]
    _, meta = load_tensors(tmp_path / "best.safetensors")
    assert meta["epoch"] == best + 1 and meta["val_acc"] == val[best]
    _, meta = load_tensors(tmp_path / "checkpoint.safetensors")
    assert meta["selected_on"] == "val" and meta["best_val_acc"] == val[best]
    _report(result)
    assert f"at the best validation accuracy {val[best]:.2f}% (epoch {best + 1})" in capsys.readouterr().out


def test_without_validation_best_stays_on_test(tmp_path, capsys):
    result = fit(load_config(None, [*TINY, f"run_dir={tmp_path}", "train.epochs=2", "data.train_per_class=20"]))
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all("val_acc" not in r and r["selected_on"] == "test" for r in records)
    test = [r["test_acc"] for r in records]
    assert result.selected_on == "test" and result.best_val_acc is None and result.best_acc == max(test)
    _report(result)
    assert "chosen on the test set" in capsys.readouterr().out


def test_resume_keeps_the_validation_best(tmp_path):
    common = [*TINY, "data.val_per_class=30", "data.train_per_class=40"]
    straight = fit(load_config(None, [*common, f"run_dir={tmp_path / 'a'}", "train.epochs=3"]))
    fit(load_config(None, [*common, f"run_dir={tmp_path / 'b'}", "train.epochs=2"]))
    resumed = fit(load_config(Path(tmp_path / "b" / "config.yaml"), ["train.epochs=3"]), resume=True)
    assert (resumed.best_epoch, resumed.best_val_acc, resumed.best_acc) == \
        (straight.best_epoch, straight.best_val_acc, straight.best_acc)
