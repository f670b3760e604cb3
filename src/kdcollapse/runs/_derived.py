"""Derived outputs of a run (analysis reports, robustness entries, figures, summaries): the run, epoch and
weights checksum they were computed from, whether they still describe the run's committed model, and the
run's lock while one is written into its directory."""

from __future__ import annotations

import hashlib
import json
import logging
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

from kdcollapse.errors import CheckpointError, KdcollapseError
from kdcollapse.runs._atomic import replacing, write_text
from kdcollapse.runs._checkpoint import read_header
from kdcollapse.runs._commit import committed_path, file_digest, read_state
from kdcollapse.runs._lock import RunLock

logger = logging.getLogger(__name__)

WEIGHTS_FILE = "model.safetensors"
# The derived outputs written into a run directory by a command given an --out there (an analysis folder, a
# figure): relative path -> {"source": what it was computed from, "written": when}. --overwrite removes them.
OUTPUTS_FILE = "outputs.json"
# The key under which a derived JSON document (analysis.json, each robust_eval.json entry) records the SHA-256 of
# its own content, so that a hand edit or damage is detected when it is read.
CONTENT_KEY = "content_sha256"


def content_digest(document: dict, label: str = "") -> str:
    """SHA-256 of ``document`` (without :data:`CONTENT_KEY`) as canonical JSON, and of ``label`` (the key an
    entry is filed under, so an entry moved to another key no longer matches)."""
    body = {k: v for k, v in document.items() if k != CONTENT_KEY}
    body = json.loads(json.dumps(body))  # as it reads back from the file: int keys become strings, tuples lists
    text = json.dumps([label, body], sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()


def sealed(document: dict, label: str = "") -> dict:
    """``document`` with :data:`CONTENT_KEY`: the digest of its content (see :func:`content_digest`)."""
    return {**document, CONTENT_KEY: content_digest(document, label)}


def seal_problem(document: dict, label: str = "") -> str | None:
    """Why ``document`` is not as kdcollapse wrote it (its content digest missing or not matching); ``None``
    when it is."""
    recorded = document.get(CONTENT_KEY)
    if not recorded:
        return f"it records no {CONTENT_KEY} (written by a version before outputs were sealed, or edited)"
    if recorded != content_digest(document, label):
        return f"it was edited after it was written (its content does not match its {CONTENT_KEY})"
    return None


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


def lm_source(source: str | Path, run_dir: str | Path, random_init: int | None = None) -> dict:
    """What an analysis of a language model (``analyze --lm``) written into ``run_dir`` records: the ``--lm``
    source and, for a model directory inside ``run_dir`` (a ``distill-lm`` run's ``student/``) analysed with its
    own weights, that folder (``lm_dir``) and the digest of its weights and config (``lm_sha256``), so that
    :func:`outputs_stale` flags the analysis once the folder holds other weights."""
    record = {"lm": str(source), "random_init": random_init}
    folder = Path(source)
    if random_init is None and folder.is_dir():
        try:
            rel = folder.resolve().relative_to(Path(run_dir).resolve()).as_posix()
        except ValueError:
            return record
        record |= {"lm_dir": rel, "lm_sha256": lm_digest(folder)}
    return record


def lm_digest(folder: Path) -> str:
    """SHA-256 over the names and bytes of a model directory's ``*.safetensors`` files and ``config.json``."""
    digest = hashlib.sha256()
    for path in [*sorted(folder.glob("*.safetensors")), folder / "config.json"]:
        if path.is_file():
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


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
    the holder if one runs, or a damaged ``outputs.json``). Yields that run directory (for
    :func:`record_outputs`)."""
    run_dir = containing_run(path)
    if run_dir is None:
        yield None
        return
    try:
        lock = RunLock(run_dir, owner=False)
    except OSError as err:
        raise CheckpointError(f"cannot write into the run directory {run_dir}: {err.strerror or err}") from None
    try:
        read_outputs(run_dir)  # a damaged list of outputs is reported before the work, not after it
        yield run_dir
    finally:
        lock.release(undo=True)


def _inside(run_dir: Path, rel: str) -> Path | None:
    """``run_dir / rel`` if it lies inside ``run_dir`` (no ``..`` or link leading out of it), else ``None``."""
    path = run_dir / rel
    try:
        path.resolve().relative_to(run_dir.resolve())
    except ValueError:
        return None
    return path


def read_outputs(run_dir: str | Path) -> dict[str, dict]:
    """The derived outputs recorded in ``run_dir/outputs.json`` (none if absent); a damaged file is a
    ``CheckpointError`` naming it."""
    path = Path(run_dir) / OUTPUTS_FILE
    if not path.is_file():
        return {}
    try:
        outputs = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is damaged ({err}); it lists the outputs derived from this run") from None
    if not isinstance(outputs, dict) or not all(isinstance(v, dict) for v in outputs.values()):
        raise CheckpointError(f"{path} is not a JSON object of outputs; it lists the outputs derived from this run")
    return outputs


def record_outputs(run_dir: str | Path, paths: Iterable[str | Path], source: dict) -> None:
    """Record ``paths`` (files just written into ``run_dir``, under its lock: inside :func:`run_lock_for`) as
    derived from ``source``, so that ``--overwrite`` removes them and :meth:`Run.stale_outputs` checks them."""
    run_dir = Path(run_dir)
    outputs = read_outputs(run_dir)
    now = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    for path in paths:
        rel = Path(path).absolute().relative_to(run_dir.absolute()).as_posix()
        outputs[rel] = {"source": source, "written": now}
    write_text(run_dir / OUTPUTS_FILE, json.dumps(outputs, indent=1, sort_keys=True) + "\n")


def remove_outputs(run_dir: str | Path) -> list[Path]:
    """Delete the derived outputs ``outputs.json`` records (files inside ``run_dir`` only), the folders they
    leave empty, and ``outputs.json``; returns the files removed. A damaged ``outputs.json`` is kept, with a
    warning (what it listed is unknown)."""
    run_dir = Path(run_dir)
    try:
        outputs = read_outputs(run_dir)
    except CheckpointError as err:
        logger.warning(f"{err}: the outputs it lists are not removed; delete them by hand")
        return []
    removed = []
    for rel in sorted(outputs):
        path = _inside(run_dir, rel)
        if path is None or not path.is_file() or path.is_symlink():
            continue
        path.unlink()
        removed.append(path)
        for folder in path.parents:
            if folder == run_dir or run_dir not in folder.parents:
                break
            try:
                folder.rmdir()  # only if empty: a file of the user's keeps its folder
            except OSError:
                break
    (run_dir / OUTPUTS_FILE).unlink(missing_ok=True)
    return removed


def outputs_stale(run_dir: str | Path) -> dict[str, str]:
    """The outputs of ``outputs.json`` (figures, post steps' files: analysis reports are checked by their own
    provenance) whose source no longer holds: ``{relative path: reason}``. An output of weights is checked against
    the run that holds it (also in a copied run directory); a figure of metrics against each run it shows."""
    run_dir = Path(run_dir)
    found = {}
    for rel, entry in read_outputs(run_dir).items():
        path = _inside(run_dir, rel)
        source = entry.get("source") or {}
        if path is None or not path.is_file() or (path.name == "analysis.json" and "lm" not in source):
            continue
        if "lm_sha256" in source:  # an analyze --lm of a model directory inside the run
            folder = _inside(run_dir, source.get("lm_dir") or "")
            changed = folder is None or not folder.is_dir() or lm_digest(folder) != source["lm_sha256"]
            reason = (f"it was computed from other weights than {run_dir / source.get('lm_dir', '?')} holds now"
                      if changed else None)
        elif "weights_sha256" in source and "runs" not in source:  # of the weights of the run that holds it
            reason = stale_reason(source, run_dir)
        else:
            reason = next(filter(None, (_metrics_changed(r) for r in source.get("runs", [])
                                        if isinstance(r, dict))), None)
        if reason:
            found[rel] = reason
    return found


def _metrics_changed(recorded: dict) -> str | None:
    """Why a figure drawn from the metrics ``recorded`` (a :func:`metrics_source`) no longer shows that run."""
    run_dir = recorded.get("run_dir")
    try:
        now = metrics_source(run_dir)
    except (KdcollapseError, OSError, TypeError) as err:
        return f"its run {run_dir} cannot be read ({err})"
    if now["metrics_sha256"] != recorded.get("metrics_sha256"):
        return (f"it was drawn from other records of {run_dir} (epoch {recorded.get('epoch')}) than its "
                f"metrics.jsonl holds now (epoch {now['epoch']})")
    return None


ROBUST_EVAL_FILE = "robust_eval.json"


def read_robust_eval(run_dir: str | Path) -> dict[str, dict]:
    """The entries of ``run_dir/robust_eval.json`` as stored (none if absent); a file that is not a JSON object of
    entries (torn, damaged) is a ``CheckpointError`` naming it. Each entry's own seal and provenance are checked
    by the caller (:meth:`Run.robust_eval`, :func:`seal_problem`, :func:`stale_reason`)."""
    path = Path(run_dir) / ROBUST_EVAL_FILE
    if not path.is_file():
        return {}
    try:
        entries = json.loads(path.read_text())
    except (ValueError, UnicodeDecodeError) as err:
        raise CheckpointError(f"{path} is damaged ({err}); move it away (its entries cannot be read) and run "
                              "robust-eval again") from None
    if not isinstance(entries, dict) or not all(isinstance(e, dict) for e in entries.values()):
        raise CheckpointError(f"{path} is not a JSON object of entries; move it away and run robust-eval again")
    return entries


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
