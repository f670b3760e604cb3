"""A run's per-epoch table: chosen ``metrics.jsonl`` keys at chosen epochs, as markdown
(``kdcollapse plot --table``)."""

from __future__ import annotations

from collections.abc import Sequence

from kdcollapse.errors import ConfigError
from kdcollapse.report._markdown import markdown_table


def key_header(key: str) -> str:
    """A metrics key as a column header: ``train_acc`` → "train acc", a time ``epoch_time_s`` → "epoch time (s)"."""
    if key.endswith("_time_s"):
        return key.removesuffix("_s").replace("_", " ") + " (s)"
    return key.replace("_", " ")


def parse_epochs(text: str) -> list[int]:
    """``"1,5,10-12"`` → ``[1, 5, 10, 11, 12]`` (epochs and inclusive ranges, in the order given)."""
    epochs = []
    for part in (p.strip() for p in text.split(",")):
        first, dash, last = part.partition("-")
        try:
            low, high = int(first), int(last if dash else first)
        except ValueError:
            raise ConfigError(f"--epochs is a comma-separated list of epochs and ranges A-B, got {text!r}") from None
        if low < 1 or high < low:
            raise ConfigError(f"--epochs: {part!r} is not an epoch ≥ 1 or a range A-B with 1 ≤ A ≤ B, in "
                              f"{text!r}")
        epochs += range(low, high + 1)
    return epochs


def epoch_table(rows: Sequence[dict], keys: Sequence[str], epochs: Sequence[int] | None = None,
                digits: int | Sequence[int] = 2, headers: Sequence[str] | None = None) -> str:
    """The markdown table of ``metrics.jsonl`` ``rows``: one row per epoch of ``epochs`` (default: every logged
    epoch), the epoch then each key's value with ``digits`` decimals (one number, or one per key) under
    ``headers`` (default :func:`key_header`); a key the epoch did not log (evaluated every few epochs) is "–".
    An epoch the run did not log, a key no epoch logged or mismatched lengths are refused."""
    by_epoch = {r["epoch"]: r for r in rows}
    digits = list(digits) if isinstance(digits, Sequence) else [digits] * len(keys)
    headers = list(headers) if headers is not None else [key_header(k) for k in keys]
    if not keys or len(digits) != len(keys) or len(headers) != len(keys):
        raise ConfigError(f"a per-epoch table needs at least one key and one digits and header entry per key: got "
                          f"{len(keys)} keys, {len(digits)} digits, {len(headers)} headers")
    if bad := [d for d in digits if not isinstance(d, int) or not 0 <= d <= 8]:
        raise ConfigError(f"digits are integers from 0 to 8, got {bad[0]!r}")
    logged = sorted({k for r in rows for k in r} - {"epoch"})
    if missing := [k for k in keys if k not in logged]:
        raise ConfigError(f"the run logs no key {', '.join(map(repr, missing))}; logged keys: {', '.join(logged)}")
    epochs = list(by_epoch) if epochs is None else list(epochs)
    if absent := [e for e in epochs if e not in by_epoch]:
        raise ConfigError(f"the run logged no epoch {', '.join(map(str, absent))}; it logged epochs "
                          f"{min(by_epoch, default=0)}-{max(by_epoch, default=0)}")
    return markdown_table(["epoch", *headers],
                          [[str(e), *(format(by_epoch[e][k], f".{d}f") if by_epoch[e].get(k) is not None else "–"
                                      for k, d in zip(keys, digits))] for e in epochs])
