"""Robustness of a trained run: its model file, the dataset's test images in [0, 1], the attacks, and
``robust_eval.json`` / ``robust_eval.md`` in the run directory (behind ``kdcollapse robust-eval``)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from kdcollapse.adversarial import (STANDARD_BUDGET, AttackSetting, Normalized, RobustEvaluation, check_count,
                                    get_attack, list_attacks, parse_eps)
from kdcollapse.data import TensorDataset, load_dataset
from kdcollapse.distributed import resolve_device
from kdcollapse.errors import CheckpointError, KdcollapseError, unknown_choice
from kdcollapse.runs import (CONTENT_KEY, Run, RunLock, committed_path, file_digest, read_robust_eval, seal_problem,
                             sealed, stale_reason, write_text)

DEFAULT_ATTACKS = ("standard", "pgd")
WEIGHTS = {"last": "model", "best": "best"}
RESULT_JSON, RESULT_MD = "robust_eval.json", "robust_eval.md"


def test_images(data, n_examples: int | None = None) -> tuple[Tensor, Tensor]:
    """The first ``n_examples`` (default: all) images of a dataset as float32 (N, C, H, W) in [0, 1] (the
    stored uint8 pixels / 255) and their int64 labels."""
    if not isinstance(data, TensorDataset) or data.inputs.dtype != torch.uint8 or data.inputs.ndim != 4:
        kind = f"{data.inputs.dtype} inputs of shape {tuple(data.input_shape)}" if isinstance(data, TensorDataset) \
            else "image files decoded on the fly"
        raise KdcollapseError(f"robust evaluation attacks uint8 images scaled to [0, 1]; dataset {data.name!r} "
                              f"holds {kind}")
    if n_examples is not None:
        check_count("n_examples", n_examples)
    n = len(data) if n_examples is None else min(n_examples, len(data))
    return data.inputs[:n].float() / 255, data.labels[:n].clone()


def load_test_images(dataset: str, root: str | None = None, n_examples: int | None = None) -> tuple[Tensor, Tensor]:
    """:func:`test_images` of the whole test split of a registered dataset."""
    return test_images(load_dataset(dataset, "test", root=root), n_examples)


def evaluate_run(
    run_dir: str | Path,
    *,
    norm: str = "Linf",
    eps: float | str = "8/255",
    attacks: Sequence[str] = DEFAULT_ATTACKS,
    n_examples: int | None = None,
    batch_size: int = 500,
    pgd_steps: int = 20,
    weights: str = "last",
    seed: int = 0,
    device: str | torch.device = "cpu",
    data_root: str | None = None,
    aa_budget: dict[str, int] | None = None,
    progress: bool = True,
    precision: str = "off",
    channels_last: bool = False,
) -> dict[str, dict]:
    """Evaluate the run's model (``model.safetensors``, or ``best.safetensors`` with ``weights="best"``)
    on the first ``n_examples`` test images of the run (its ``data.classes`` and test subset) under each
    registered evaluation in ``attacks`` (``kdcollapse.adversarial.list_attacks()``): ``"standard"``
    (AutoAttack standard, or the same chain with ``aa_budget`` = {n_iter, n_targets, n_queries} when given,
    named ``autoattack-reduced``) and ``"pgd"`` (PGD-``pgd_steps``). Inputs are the images in [0, 1]; the
    model file's mean/std go inside the model (:class:`Normalized`). ``precision`` (off | auto | bf16 | fp16) and
    ``channels_last`` make the attacks' search faster; every verdict is the float32 model's.

    Writes ``robust_eval.json`` (entries keyed by attack, norm, ε and weights; earlier entries with
    other keys are kept) and ``robust_eval.md`` into the run directory; returns the new entries.
    """
    run = Run(run_dir)
    device = resolve_device(device, option="device")
    if weights not in WEIGHTS:
        raise KdcollapseError(unknown_choice("weights", weights, tuple(WEIGHTS)))
    for name in attacks:
        get_attack(name)
    if not attacks:
        raise KdcollapseError(f"no attack chosen; choose from {', '.join(list_attacks())}")
    eps_value = parse_eps(eps, norm=norm, name="eps")
    budget = {**STANDARD_BUDGET, **(aa_budget or {})}
    for key, value in budget.items():
        if key not in STANDARD_BUDGET:
            raise KdcollapseError(unknown_choice("AutoAttack budget", key, tuple(STANDARD_BUDGET)))
        check_count(key, value)
    check_count("pgd_steps", pgd_steps)
    model_file = run.dir / f"{WEIGHTS[weights]}.safetensors"
    if not model_file.is_file():
        raise CheckpointError(f"{run.dir} holds no {model_file.name} (has the run finished an epoch?)")
    _read_results(run.dir)  # a damaged results file, or a run directory that takes no file: before the attacks
    _check_writable(run.dir)
    net, meta = run.model(WEIGHTS[weights], device)
    digest = file_digest(committed_path(run.dir, model_file.name))
    targets = (aa_budget or {}).get("n_targets", STANDARD_BUDGET["n_targets"])  # the default adapts to K
    if targets != STANDARD_BUDGET["n_targets"] and targets > int(meta["num_classes"]) - 1:
        raise KdcollapseError(f"aa_targets={targets}: a {meta['num_classes']}-class model has at "
                              f"most {int(meta['num_classes']) - 1} target classes")
    if "dataset" not in meta or "mean" not in meta:
        raise CheckpointError(f"{model_file} carries no dataset metadata (dataset, mean, std); it was not "
                              "written by `kdcollapse train`")
    model = Normalized(net, meta["mean"], meta["std"]).to(device).eval()
    if data_root is not None:
        run.config.data.root = data_root
    x, y = test_images(run.dataset("test"), n_examples)
    x, y = x.to(device), y.to(device)
    setting = AttackSetting(eps=eps_value, norm=norm, seed=seed, batch_size=batch_size, progress=progress,
                            pgd_steps=pgd_steps, aa_budget=budget, num_classes=int(meta["num_classes"]),
                            precision=precision, channels_last=channels_last)
    entries = {}
    for name in attacks:
        start = time.perf_counter()
        label, result, used = get_attack(name)(model, x, y, setting)
        key = f"{label} {norm} eps={eps} {weights}"
        entries[key] = sealed(_entry(
            result, label=label, eps=eps, meta=meta, model_file=model_file.name, seed=seed,
            seconds=time.perf_counter() - start, budget=used) | {"search_precision": precision,
                                                                 "search_channels_last": channels_last,
                                                                 "epoch": meta.get("epoch"), "weights_sha256": digest},
            key)  # its content_sha256: a hand edit is detected when it is read
    _write(run.dir, entries)
    return entries


def _entry(result: RobustEvaluation, *, label: str, eps: float | str, meta: dict, model_file: str, seed: int,
           seconds: float, budget: dict) -> dict:
    return {
        "attack": label, "eps_text": str(eps), **result.summary(), "budget": budget, "seed": seed,
        "examples": f"first {len(result.robust)} test images", "model_file": model_file,
        "model": meta.get("model"), "method": meta.get("method"), "dataset": meta.get("dataset"),
        "total_seconds": seconds, "finished": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "table": result.table(),
    }


def _read_results(run_dir: Path) -> dict:
    """The entries of ``robust_eval.json`` (none if absent); a damaged file, or an entry edited after it was written
    (its ``content_sha256`` does not match), is an error, never silently replaced or carried on. Entries of
    versions before entries were sealed are kept (``Run.stale_outputs`` and the report flag them)."""
    entries = read_robust_eval(run_dir)
    for key, entry in entries.items():
        if entry.get(CONTENT_KEY) and (problem := seal_problem(entry, key)):
            raise CheckpointError(f"{run_dir / RESULT_JSON} entry {key!r}: {problem}; move the file away (or restore "
                                  "it) and run again")
    return entries


def _check_writable(run_dir: Path) -> None:
    probe = run_dir / f".robust-eval-probe-{os.getpid()}"
    try:
        probe.write_text("")
        probe.unlink()
    except OSError as err:
        raise CheckpointError(f"cannot write the results into {run_dir} ({err.strerror or err}); "
                              "robust-eval writes robust_eval.json there") from None


def stale(entry: dict, run_dir: Path) -> bool:
    """Whether ``entry`` measured other weights than the run's committed model file it names (an entry
    from before ``--overwrite`` or a resume, or one written before entries recorded the checksum)."""
    return stale_reason(entry, run_dir) is not None


def _mark(key: str, entry: dict, run_dir: Path | None) -> str:
    if run_dir is None:
        return ""
    if stale(entry, run_dir):
        return " (stale: other weights)"
    return " (edited or unsealed: not as robust-eval wrote it)" if seal_problem(entry, key) else ""


def _write(run_dir: Path, entries: dict[str, dict]) -> None:
    """Merge ``entries`` into ``robust_eval.json`` and rewrite ``robust_eval.md``: atomically, under the run's
    lock (so never beside a trainer writing the same run)."""
    lock = RunLock(run_dir, owner=False)
    try:
        merged = {**_read_results(run_dir), **entries}
        write_text(run_dir / RESULT_JSON, json.dumps(merged, indent=2) + "\n")
        write_text(run_dir / RESULT_MD, markdown_report(str(run_dir), merged, run_dir))
    finally:
        lock.release(undo=True)


def markdown_report(title: str, entries: dict[str, dict], run_dir: Path | None = None) -> str:
    """Summary table of every evaluation, then each one's per-attack breakdown; with ``run_dir``, an entry
    that measured other weights than the run's committed ones is marked stale."""
    lines = [f"# Robustness of {title}", "",
             "| evaluation | model file | examples | clean | robust | time (s) |", "|---|---|---:|---:|---:|---:|"]
    for key, e in entries.items():
        mark = _mark(key, e, run_dir)
        lines.append(f"| {e['attack']} {e['norm']} ε={e['eps_text']}{mark} | {e['model_file']} | {e['n']} | "
                     f"{e['clean_accuracy']:.2%} | {e['robust_accuracy']:.2%} | {e['total_seconds']:.0f} |")
    for key, e in entries.items():
        lines += ["", f"## {key}", "", f"{e['examples']}, seed {e['seed']}, budget {e['budget']}.", "", e["table"]]
    return "\n".join(lines) + "\n"
