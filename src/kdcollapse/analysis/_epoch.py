"""Collapse metrics during training: the trainer's per-epoch hook (``analysis.every``)."""

from __future__ import annotations

import time

from torch import nn

from kdcollapse.analysis._pass import classifier_weight, feature_pass, split_metrics
from kdcollapse.config import RunConfig
from kdcollapse.data import make_loader
from kdcollapse.metrics import METRICS

# The compact set logged per epoch (``per_epoch`` in the metric catalogue), as train_<key> and test_<key>;
# gnc2 depends on the head alone and is logged once, as gnc2.
EPOCH_KEYS = tuple(m.name for m in METRICS if m.per_epoch)


def analysis_due(cfg: RunConfig, epoch: int) -> bool:
    """Whether the 0-based ``epoch`` gets collapse metrics: every ``analysis.every`` epochs and the last."""
    every = cfg.analysis.every
    return every > 0 and ((epoch + 1) % every == 0 or epoch + 1 == cfg.train.epochs)


def epoch_collapse_metrics(cfg: RunConfig, epoch: int, model: nn.Module, train_set, test_set) -> dict[str, float]:
    """``train_<key>`` and ``test_<key>`` for each of :data:`EPOCH_KEYS`, ``gnc2`` (of the head; absent for a
    non-linear head) and ``analysis_time_s``, when the epoch is due (:func:`analysis_due`), else ``{}``.

    Train features come from the run's training set cut to ``analysis.train_per_class`` samples per
    class (drawn with the run's seed; the same subset every epoch), test features from its whole test
    set; both unaugmented, in eval mode, batched by ``data.eval_batch_size``. The model's mode is
    restored. ``kdcollapse analyze RUN_DIR --split train --per-class N`` reproduces the last epoch's
    values from the saved model. Runs in one process (the trainer calls it on rank 0 only).
    """
    if not analysis_due(cfg, epoch):
        return {}
    start = time.perf_counter()
    if cfg.analysis.train_per_class:
        train_set = train_set.subset(cfg.analysis.train_per_class, seed=cfg.seed)
    device = next(model.parameters()).device
    record = {}
    for split, dataset in (("train", train_set), ("test", test_set)):
        loader = make_loader(dataset, cfg.data.eval_batch_size, train=False, device=device, seed=0)
        result = feature_pass(model, loader, num_classes=dataset.num_classes, seed=cfg.seed)
        metrics = split_metrics(result, classifier_weight(model))
        record |= {f"{split}_{key}": metrics[key] for key in EPOCH_KEYS if key in metrics}
        if "gnc2" in metrics:
            record["gnc2"] = metrics["gnc2"]
    record["analysis_time_s"] = time.perf_counter() - start
    return record
