"""Which data belongs to a run: the one definition the trainer, ``analyze``, ``robust-eval`` and the reports
share."""

from __future__ import annotations

from kdcollapse.config import RunConfig
from kdcollapse.data import load_dataset
from kdcollapse.data._dataset import SPLITS
from kdcollapse.errors import DataError, unknown_choice


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise DataError(unknown_choice("split", split, SPLITS))
    return split


def run_dataset(cfg: RunConfig, split: str, per_class: int | None = None):
    """Split ``split`` of a run's data exactly as training saw it.

    ``data.classes`` is selected and relabelled first, then the split's ``data.<split>_per_class`` subset
    is drawn with the run's seed; ``per_class`` cuts that further, with the same seed (the subset that
    ``analysis.train_per_class`` gives the per-epoch metrics).
    """
    d = cfg.data
    dataset = load_dataset(d.name, check_split(split), root=d.root)
    if d.classes is not None:
        dataset = dataset.select_classes(d.classes)
    for n in (getattr(d, f"{split}_per_class", None), per_class):
        if n:
            dataset = dataset.subset(n, seed=cfg.seed)
    return dataset
