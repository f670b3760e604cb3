"""The per-epoch records of a run: ``metrics.jsonl`` and ``metrics.csv`` (committed with each epoch's
checkpoint; ``steps.jsonl`` for a language-model run's steps), read back up to the last commit, and
:class:`MetricsLog`, which also feeds TensorBoard and the trackers once an epoch is committed."""

from __future__ import annotations

import csv
import hashlib
import io
import json
import warnings
from pathlib import Path

from kdcollapse.config import config_to_dict
from kdcollapse.config_lm import load_run_config, tracking
from kdcollapse.errors import CheckpointError, ConfigError
from kdcollapse.runs._atomic import write_text
from kdcollapse.runs._commit import STATE_FILE, committed_file
from kdcollapse.runs._tracking import numbers, open_trackers, tracker_rows, value_step


def read_metrics(run_dir: str | Path) -> list[dict]:
    """The records of ``metrics.jsonl`` (``run_dir`` is the run directory or that file). A torn last line
    (a crash or full disk while an older version appended to it) is dropped with a warning; damage
    anywhere else is an error."""
    path = Path(run_dir)
    path = path / "metrics.jsonl" if path.is_dir() else path
    if not path.exists():
        return []
    lines = [(n, line) for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1) if line.strip()]
    records = []
    for n, line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif n == lines[-1][0]:
            warnings.warn(f"{path}: ignoring its last line {n}, which is torn (the run was interrupted while "
                          "writing it)", stacklevel=2)
        else:
            raise CheckpointError(f"{path}: line {n} is not a JSON record")
    return records


STEPS_FILE = "steps.jsonl"


def read_committed_metrics(run_dir: Path, epoch: int | None = None, name: str = "metrics.jsonl") -> list[dict]:
    """The records of ``run_dir/metrics.jsonl`` up to the last committed epoch (or ``epoch``), read from the
    file ``state.json`` records (its staged copy between a commit and its renames; none when it was removed).
    A file whose SHA-256 is not the recorded one (edited or damaged) is refused; a torn last line after the
    committed bytes (an older version's interrupted append) is dropped with a warning. Runs without
    ``state.json``: as they are."""
    run_dir = Path(run_dir)
    path, state = committed_file(run_dir, name)
    if path is None and not (run_dir / name).exists():
        return []  # removed (after an edit): no records
    if path is None and not _committed_plus_torn_line(run_dir / name, state):
        raise CheckpointError(
            f"{run_dir / name} is not the file of epoch {state['epoch']} that {STATE_FILE} records "
            "(edited, or damaged); restore it, or remove it (a `--resume` then continues without the records of "
            "the earlier epochs)")
    records = read_metrics(path or run_dir / name)
    last = epoch if epoch is not None else state["epoch"] if state else None
    # the commit unit: an image run's epoch, a language-model run's optimizer step
    return records if last is None else [r for r in records if r.get("epoch", r.get("step", 0)) <= last]


def _committed_plus_torn_line(path: Path, state: dict | None) -> bool:
    """Whether ``path`` is the file ``state.json`` records followed by one unterminated line."""
    entry = (state or {}).get("files", {}).get(path.name)
    if entry is None or not path.is_file():
        return False
    data = path.read_bytes()
    if data.endswith(b"\n"):
        return False
    head = data[:data.rfind(b"\n") + 1]
    return hashlib.sha256(head).hexdigest() == entry["sha256"]


def metrics_jsonl(records: list[dict]) -> str:
    """``records`` as JSON lines, one per record."""
    return "".join(json.dumps(r) + "\n" for r in records)


def metrics_csv(records: list[dict]) -> str:
    """``records`` as CSV: one row per record, one column per key that any record has (in the order keys
    first appear), an empty cell where a record lacks the key (epochs without evaluation or analysis)."""
    columns = list(dict.fromkeys(key for record in records for key in record))
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(columns)
    for record in records:
        writer.writerow(["" if key not in record else value if isinstance(value := record[key], str)
                         else json.dumps(value) for key in columns])
    return out.getvalue() if records else ""


TENSORBOARD_DIR = "tensorboard"


def remove_event_files(folder: Path) -> None:
    """Delete the TensorBoard event files in ``folder`` (other files there are left alone)."""
    for path in folder.glob("*tfevents*"):
        path.unlink(missing_ok=True)


class MetricsLog:
    """The per-epoch records of ``metrics.jsonl`` and ``metrics.csv`` (both written by :meth:`RunDir.commit`,
    with the checkpoint of the same epoch), TensorBoard when asked, and the trackers the run's saved config
    names (``train.trackers``: W&B, MLflow).

    On resume, records of epochs after the checkpoint (written before a crash) are dropped first, and both
    files are rewritten from the records kept (``metrics.csv`` is re-derived from ``metrics.jsonl``, so a run
    of a version without it gains it).

    TensorBoard's event log is append-only, so it cannot be replaced atomically like the other files; it is
    kept a prefix of what was committed instead. An epoch's scalars reach it (and the trackers) only in
    :meth:`committed`, after the epoch's commit, so a crash never leaves a step there that ``state.json`` does not
    record (at worst a torn last record, or the committed epoch's scalars missing). Every start rebuilds it, under
    the run's lock: the event files are deleted and the committed records written again, so a resumed run has
    each step exactly once, and turning ``train.tensorboard`` on in a resume gains the earlier epochs.
    """

    FILES = {"metrics.jsonl": metrics_jsonl, "metrics.csv": metrics_csv}

    def __init__(self, run_dir: Path, *, start_epoch: int = 0, enabled: bool = True, tensorboard: bool = False):
        self.path = run_dir / "metrics.jsonl"
        self.enabled = enabled
        self.writer = None
        self.records: list[dict] = []
        self.pending: list[dict] = []  # written, not yet committed
        self.trackers: list = []
        self.steps: list[dict] = []  # per-step scalars (write_step), committed in steps.jsonl
        self.pending_steps: list[dict] = []
        if not enabled:
            return
        if start_epoch > 0 or (run_dir / STATE_FILE).is_file():  # a resume (of a language model's step 0 too)
            self.records = read_committed_metrics(run_dir, start_epoch)  # verified against state.json
            if (run_dir / STEPS_FILE).exists():
                self.steps = read_committed_metrics(run_dir, start_epoch, STEPS_FILE)
        if self.path.exists():
            for name, text in self.files().items():
                write_text(run_dir / name, text)
        if tensorboard:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise ConfigError("train.tensorboard=true needs the tensorboard package: "
                                  "pip install 'kdcollapse[tensorboard]'") from None
            remove_event_files(run_dir / TENSORBOARD_DIR)  # rebuilt from the committed records
            self.writer = SummaryWriter(str(run_dir / TENSORBOARD_DIR))
            self._to_tensorboard(tracker_rows(self.steps, self.records))
        if (run_dir / "config.yaml").is_file():  # the run's own config names its trackers (train.trackers)
            cfg = load_run_config(run_dir / "config.yaml")
            trackers, group, _ = tracking(cfg)
            self.trackers = open_trackers(trackers, run_dir, config_to_dict(cfg), group)
            for tracker in self.trackers:  # a resume: the committed epochs a crash kept from a tracker
                tracker.replay(tracker_rows(self.steps, self.records))

    def write(self, record: dict) -> None:
        """Add ``record``; it reaches ``metrics.jsonl`` and ``metrics.csv`` with the next commit, TensorBoard
        and the trackers once that commit is done (:meth:`committed`)."""
        if not self.enabled:
            return
        self.records.append(record)
        self.pending.append(record)

    def write_step(self, record: dict) -> None:
        """Add a per-step record (``step``, the optimizer step from the run's start; an image run's ``epoch``;
        scalars): committed in ``steps.jsonl`` with the next commit, then logged to TensorBoard (as
        ``step/<key>``) and the trackers (:func:`~kdcollapse.runs._tracking.tracker_rows`), for both tasks."""
        if not self.enabled:
            return
        self.steps.append(record)
        self.pending_steps.append(record)

    def committed(self) -> None:
        """The records written so far are committed: log them to TensorBoard and the trackers."""
        pending, self.pending = self.pending, []
        steps, self.pending_steps = self.pending_steps, []
        rows = tracker_rows(steps, pending)
        self._to_tensorboard(rows)
        for row in rows:
            for tracker in self.trackers:
                tracker.log(row)

    def _to_tensorboard(self, rows: list[dict]) -> None:
        if self.writer is None or not rows:
            return
        for row in rows:
            for key, value in numbers(row).items():
                self.writer.add_scalar(key, value, value_step(row, key))
        self.writer.flush()

    def files(self) -> dict[str, str]:
        """The text of each metrics file, by name."""
        return {name: render(self.records) for name, render in self.FILES.items()} | (
            {STEPS_FILE: metrics_jsonl(self.steps)} if self.steps else {})

    def close(self, failed: bool = False) -> None:
        """End TensorBoard's writer and the trackers, marking their runs failed when training ``failed`` (a
        second call does nothing)."""
        if self.writer is not None:
            self.writer.close()
            self.writer = None
        for tracker in self.trackers:
            tracker.close(failed)
        self.trackers = []
