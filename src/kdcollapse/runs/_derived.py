"""Derived outputs of a run (analysis reports, robustness entries, figures, summaries): the run, epoch and
weights checksum they were computed from, whether they still describe the run's committed model, and the
run's lock while one is written into its directory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from kdcollapse.errors import CheckpointError, KdcollapseError
from kdcollapse.runs._atomic import replacing
from kdcollapse.runs._checkpoint import read_header
from kdcollapse.runs._commit import committed_path, file_digest, read_state
from kdcollapse.runs._lock import RunLock

WEIGHTS_FILE = "model.safetensors"


def source_of(run_dir: str | Path, weights_file: str = WEIGHTS_FILE) -> dict:
    """What a derived output records about the weights it was computed from: ``run_dir``, ``weights_file``,
    its ``epoch`` and ``weights_sha256`` (the digest ``state.json`` records), as last committed."""
    path = committed_path(Path(run_dir), weights_file)
    return {"run_dir": str(run_dir), "weights_file": weights_file, "epoch": read_header(path)[0].get("epoch"),
            "weights_sha256": file_digest(path)}


def metrics_source(run_dir: str | Path) -> dict:
    """What an output derived from ``metrics.jsonl`` (a plot, a summary) records: the run, the last committed
    epoch and the digests that ``state.json`` records for ``metrics.jsonl`` and ``model.safetensors``
    (``None`` for runs of versions without ``state.json``)."""
    files = (read_state(Path(run_dir)) or {"files": {}})
    return {"run_dir": str(run_dir), "epoch": files.get("epoch"),
            "metrics_sha256": files["files"].get("metrics.jsonl", {}).get("sha256"),
            "weights_sha256": files["files"].get(WEIGHTS_FILE, {}).get("sha256")}


def stale_reason(record: dict, run_dir: str | Path) -> str | None:
    """Why ``record`` (an output with the keys of :func:`source_of`) no longer describes the weights committed
    in ``run_dir``; ``None`` while it does."""
    run_dir = Path(run_dir)
    name = record.get("weights_file") or record.get("model_file") or WEIGHTS_FILE
    recorded = record.get("weights_sha256")
    if not recorded:
        return "it records no weights checksum (written by a version before provenance was recorded)"
    try:
        current = source_of(run_dir, name)
    except KdcollapseError as err:
        return str(err)
    if current["weights_sha256"] != recorded:
        return (f"it was computed from other weights (epoch {record.get('epoch')}, sha256 {recorded[:12]}) than "
                f"{run_dir / name} holds now (epoch {current['epoch']}, sha256 {current['weights_sha256'][:12]})")
    return None


def containing_run(path: str | Path) -> Path | None:
    """The run directory (a folder with ``config.yaml`` and ``run.json``) that is ``path`` or holds it."""
    path = Path(path).absolute()
    for folder in (path, *path.parents):
        if (folder / "config.yaml").is_file() and (folder / "run.json").is_file():
            return folder
    return None


@contextmanager
def run_lock_for(path: str | Path) -> Iterator[Path | None]:
    """Hold the lock of the run directory that holds ``path`` (if any) for the ``with`` body, so a derived
    output is never written beside a trainer changing the weights it describes (``CheckpointError`` naming
    the holder if one runs). Yields that run directory."""
    run_dir = containing_run(path)
    if run_dir is None:
        yield None
        return
    try:
        lock = RunLock(run_dir, owner=False)
    except OSError as err:
        raise CheckpointError(f"cannot write into the run directory {run_dir}: {err.strerror or err}") from None
    try:
        yield run_dir
    finally:
        lock.release(undo=True)


# Where a figure format keeps free text: the provenance of a figure is recorded there as JSON.
FIGURE_TEXT_KEYS = {"png": "Source", "svg": "Description", "pdf": "Subject"}


def save_figure(fig, path: str | Path, source: dict | None = None, **savefig) -> Path:
    """``fig.savefig`` into ``path`` atomically, with ``source`` (what the figure was computed from) as JSON in
    the file's metadata where the format has a text field (:data:`FIGURE_TEXT_KEYS`; read back with
    :func:`figure_source`)."""
    path = Path(path)
    fmt = path.suffix.lstrip(".").lower() or "png"
    key = FIGURE_TEXT_KEYS.get(fmt)
    metadata = {key: json.dumps(source, sort_keys=True)} if source and key else None
    with replacing(path) as tmp:
        fig.savefig(tmp, format=fmt, metadata=metadata, **savefig)
    return path


def figure_source(path: str | Path) -> dict | None:
    """The provenance :func:`save_figure` recorded in a PNG figure (``None`` if it carries none)."""
    from PIL import Image

    with Image.open(path) as image:
        text = getattr(image, "text", {}).get(FIGURE_TEXT_KEYS["png"])
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None
