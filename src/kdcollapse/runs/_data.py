"""Which data belongs to a run: the one definition the trainer, ``analyze``, ``robust-eval`` and the reports
share, for a registered dataset (``data.name``) and for splits passed from Python (:class:`UserData`)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from kdcollapse.config import RunConfig
from kdcollapse.data import USER_DATA, as_dataset, data_fingerprint, load_dataset, split_validation
from kdcollapse.errors import CheckpointError, DataError, unknown_choice

RUN_SPLITS = ("train", "val", "test")
PASS_AGAIN = ("pass the same data again: fit(cfg, resume=True, train_data=..., test_data=...) or "
              "Run(run_dir, train_data=..., test_data=...)")


def check_split(split: str) -> str:
    if split not in RUN_SPLITS:
        raise DataError(unknown_choice("split", split, RUN_SPLITS))
    return split


@dataclass(frozen=True)
class UserData:
    """A run's splits passed from Python instead of ``data.name`` (which then reads ``"user"``).

    Build it with :meth:`of`. Every split is normalised with the training split's ``mean``/``std`` and
    shares its classes; ``val`` (optional) replaces the split ``data.val_per_class`` would carve.
    """

    train: Any  # TensorDataset | FolderDataset
    test: Any
    val: Any = None

    @classmethod
    def of(cls, train_data: Any, test_data: Any, val_data: Any = None) -> UserData | None:
        """The splits read through :func:`kdcollapse.data.as_dataset` and checked against each other;
        ``None`` when none is given."""
        if train_data is None and test_data is None and val_data is None:
            return None
        if train_data is None or test_data is None:
            raise DataError("give both train_data and test_data (val_data is optional)")
        train = dataclasses.replace(as_dataset(train_data, name=USER_DATA), name=USER_DATA)
        shared = {"classes": train.classes, "mean": train.mean, "std": train.std}
        splits = [cls._follow(train, data, split, shared) for split, data in (("test", test_data), ("val", val_data))]
        return cls(train, *splits)

    @staticmethod
    def _follow(train, data: Any, split: str, shared: dict):
        if data is None:
            return None
        dataset = as_dataset(data, name=f"{split}_data", **shared)
        if dataset.classes != train.classes or dataset.input_shape != train.input_shape:
            raise DataError(
                f"{split}_data has {dataset.num_classes} classes and inputs {tuple(dataset.input_shape)}, but "
                f"train_data has {train.num_classes} classes and inputs {tuple(train.input_shape)}; the splits "
                "must share both"
            )
        return dataclasses.replace(dataset, name=USER_DATA, mean=train.mean, std=train.std)

    @cached_property
    def fingerprint(self) -> dict:
        """Each split's :func:`kdcollapse.data.data_fingerprint`; recorded as ``user_data`` in ``run.json``."""
        splits = (("train", self.train), ("val", self.val), ("test", self.test))
        return {split: data_fingerprint(data) for split, data in splits if data is not None}

    def check_run(self, run_dir: Path) -> None:
        """Raise unless ``run_dir`` was trained on exactly these splits (its ``run.json`` ``user_data``)."""
        path = Path(run_dir) / "run.json"
        recorded = json.loads(path.read_text()).get("user_data") if path.is_file() else None
        if recorded is None:
            raise CheckpointError(f"{run_dir} was not trained on data passed from Python (its run.json records "
                                  "none); open it without train_data/test_data")
        differ = [split for split in RUN_SPLITS if recorded.get(split) != self.fingerprint.get(split)]
        if differ:
            split = differ[0]
            was, now = recorded.get(split) or {}, self.fingerprint.get(split) or {}
            raise CheckpointError(
                f"{run_dir} was trained on other {split} data ({was.get('samples')} samples, sha256 "
                f"{str(was.get('sha256'))[:12]}...; given: {now.get('samples')} samples, sha256 "
                f"{str(now.get('sha256'))[:12]}...); {PASS_AGAIN}"
            )


def run_splits(cfg: RunConfig, user: UserData | None = None) -> tuple[Any, Any, Any]:
    """``(train, val, test)`` of a run as :func:`run_dataset` gives them; ``val`` is ``None`` for a run
    without a validation split."""
    has_val = cfg.data.val_per_class or (user is not None and user.val is not None)
    return (run_dataset(cfg, "train", user=user), run_dataset(cfg, "val", user=user) if has_val else None,
            run_dataset(cfg, "test", user=user))


def run_dataset(cfg: RunConfig, split: str, per_class: int | None = None, *, user: UserData | None = None):
    """Split ``split`` (``train``, ``val`` or ``test``) of a run's data exactly as training saw it.

    The data is the registered dataset ``data.name``, or ``user``'s splits (a run with ``data.name:
    user`` has no other). ``data.classes`` is selected and relabelled first; ``val`` is the
    ``data.val_per_class`` images per class carved from the training split with the run's seed (or
    ``user.val``), ``train`` what is left, cut to ``data.train_per_class`` with the run's seed; ``test`` is
    cut to ``data.test_per_class``. ``per_class`` cuts the result further, with the same seed (the subset
    that ``analysis.train_per_class`` gives the per-epoch metrics).
    """
    d = cfg.data
    source = "test" if check_split(split) == "test" else "train"
    if per_class is not None and (isinstance(per_class, bool) or not isinstance(per_class, int) or per_class < 1):
        raise DataError(f"per_class must be a positive int (samples per class) or None (all of them), got {per_class!r}")
    own_val = user is not None and user.val is not None
    if own_val and d.val_per_class:
        raise DataError(f"give either val_data or data.val_per_class={d.val_per_class}, not both")
    dataset = _source(cfg, "val" if own_val and split == "val" else source, user)
    if d.classes is not None:
        dataset = dataset.select_classes(d.classes)
    if source == "train" and not own_val:
        train, val = split_validation(dataset, d.val_per_class, cfg.seed)
        if split == "val" and val is None:
            raise DataError("this run has no validation split (data.val_per_class is 0)")
        dataset = val if split == "val" else train
    for n in (getattr(d, f"{split}_per_class", None) if split != "val" else None, per_class):
        if n:
            dataset = dataset.subset(n, seed=cfg.seed)
    return dataset


def _source(cfg: RunConfig, split: str, user: UserData | None):
    if user is not None:
        return getattr(user, split)
    if cfg.data.name == USER_DATA:
        raise DataError(f"this run (data.name={USER_DATA!r}) was trained on data passed from Python, which is not "
                        f"stored with it; {PASS_AGAIN}")
    return load_dataset(cfg.data.name, split, root=cfg.data.root)
