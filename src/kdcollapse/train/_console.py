"""The one line per epoch that the trainer logs through :mod:`logging` (logger ``kdcollapse.train``).

The library adds no handler (``kdcollapse`` has a ``NullHandler``), so a program that uses it sees the
lines only if it configures logging, e.g. ``logging.basicConfig(level=logging.INFO)``; the command line
prints them on stderr (``--quiet`` hides them). Each record carries the epoch's full ``metrics.jsonl``
record as ``record.metrics``.
"""

from __future__ import annotations

import logging

logger = logging.getLogger("kdcollapse.train")


def epoch_line(record: dict, epochs: int) -> str:
    """``epoch 3/30  loss 0.4123  train 85.12%  val 84.00%  test 83.50%  lr 0.05  1234 img/s  12.3 s``
    (``val``/``test`` only on evaluated epochs)."""
    parts = [f"epoch {record['epoch']}/{epochs}", f"loss {record['train_loss']:.4f}",
             f"train {record['train_acc']:.2f}%"]
    parts += [f"{split} {record[f'{split}_acc']:.2f}%" for split in ("val", "test") if f"{split}_acc" in record]
    parts += [f"lr {record['lr']:.4g}", f"{record['images_per_s']:.0f} img/s", f"{record['epoch_time_s']:.1f} s"]
    return "  ".join(parts)


def log_epoch(record: dict, epochs: int) -> None:
    """Log the line of a finished (committed) epoch at INFO."""
    logger.info(epoch_line(record, epochs), extra={"metrics": record})
