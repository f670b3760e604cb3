"""Which data belongs to a run: the one definition the trainer, ``analyze``, ``robust-eval`` and the reports
share."""

from __future__ import annotations

from kdcollapse.config import RunConfig
from kdcollapse.data import load_dataset, split_validation
from kdcollapse.errors import DataError, unknown_choice

RUN_SPLITS = ("train", "val", "test")


def check_split(split: str) -> str:
    if split not in RUN_SPLITS:
        raise DataError(unknown_choice("split", split, RUN_SPLITS))
    return split


def run_dataset(cfg: RunConfig, split: str, per_class: int | None = None):
    """Split ``split`` (``train``, ``val`` or ``test``) of a run's data exactly as training saw it.

    ``data.classes`` is selected and relabelled first; ``val`` is the ``data.val_per_class`` images per
    class carved from the training split with the run's seed (``None`` for a run without one), ``train``
    what is left, cut to ``data.train_per_class`` with the run's seed; ``test`` is cut to
    ``data.test_per_class``. ``per_class`` cuts the result further, with the same seed (the subset that
    ``analysis.train_per_class`` gives the per-epoch metrics).
    """
    d = cfg.data
    source = "test" if check_split(split) == "test" else "train"
    dataset = load_dataset(d.name, source, root=d.root)
    if d.classes is not None:
        dataset = dataset.select_classes(d.classes)
    if source == "train":
        train, val = split_validation(dataset, d.val_per_class, cfg.seed)
        if split == "val" and val is None:
            raise DataError("this run has no validation split (data.val_per_class is 0)")
        dataset = val if split == "val" else train
    for n in (getattr(d, f"{split}_per_class", None) if split != "val" else None, per_class):
        if n:
            dataset = dataset.subset(n, seed=cfg.seed)
    return dataset
