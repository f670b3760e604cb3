"""Robustness of a trained run: its model file, the dataset's test images in [0, 1], the attacks, and
``robust_eval.json`` / ``robust_eval.md`` in the run directory (behind ``kdcollapse robust-eval``)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from torch import Tensor

from kdcollapse.adversarial import (STANDARD_BUDGET, AttackSetting, Normalized, RobustEvaluation, check_count,
                                    get_attack, list_attacks, parse_eps)
from kdcollapse.data import TensorDataset, load_dataset
from kdcollapse.errors import CheckpointError, KdcollapseError, unknown_choice
from kdcollapse.runs import Run

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
    model file's mean/std go inside the model (:class:`Normalized`). ``precision`` (off | bf16 | fp16) and
    ``channels_last`` make the attacks' search faster; every verdict is the float32 model's.

    Writes ``robust_eval.json`` (entries keyed by attack, norm, ε and weights; earlier entries with
    other keys are kept) and ``robust_eval.md`` into the run directory; returns the new entries.
    """
    run = Run(run_dir)
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
    net, meta = run.model(WEIGHTS[weights], device)
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
        entries[f"{label} {norm} eps={eps} {weights}"] = _entry(
            result, label=label, eps=eps, meta=meta, model_file=model_file.name, seed=seed,
            seconds=time.perf_counter() - start, budget=used) | {"search_precision": precision,
                                                                 "search_channels_last": channels_last}
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


def _write(run_dir: Path, entries: dict[str, dict]) -> None:
    path = run_dir / RESULT_JSON
    merged = {}
    if path.is_file():
        try:
            merged = json.loads(path.read_text())
        except json.JSONDecodeError:
            merged = {}  # a damaged file is replaced, not merged
    merged = {**merged, **entries}
    path.write_text(json.dumps(merged, indent=2) + "\n")
    (run_dir / RESULT_MD).write_text(markdown_report(str(run_dir), merged))


def markdown_report(title: str, entries: dict[str, dict]) -> str:
    """Summary table of every evaluation, then each one's per-attack breakdown."""
    lines = [f"# Robustness of {title}", "",
             "| evaluation | model file | examples | clean | robust | time (s) |", "|---|---|---:|---:|---:|---:|"]
    for key, e in entries.items():
        lines.append(f"| {e['attack']} {e['norm']} ε={e['eps_text']} | {e['model_file']} | {e['n']} | "
                     f"{e['clean_accuracy']:.2%} | {e['robust_accuracy']:.2%} | {e['total_seconds']:.0f} |")
    for key, e in entries.items():
        lines += ["", f"## {key}", "", f"{e['examples']}, seed {e['seed']}, budget {e['budget']}.", "", e["table"]]
    return "\n".join(lines) + "\n"
