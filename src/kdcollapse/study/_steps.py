"""Registered steps. Post steps (``STEPS``): measurements of a run's last saved model that no ``kdcollapse``
command writes (``max_logit``, ``feature_geometry``). Run steps (``RUN_STEPS``): computations that are a study's
runs instead of an image training run (``ufm``; ``distill_lm``, a ``kdcollapse distill-lm`` run, which takes
its run directory and locks it itself; ``teacher_lm``, the teacher of a distill-lm config evaluated as its
students are), written to ``result.json`` in their run directory. A
study names one as ``post: [{step: NAME, creates: FILE.json}]`` (the GNC and VCI measurements are in
:mod:`kdcollapse.experiments` and imported when they run); the executor writes the mapping it returns to
``FILE.json`` in the run directory, and the summary may read its numbers as last-epoch metrics."""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch
import yaml

from kdcollapse.data import make_loader
from kdcollapse.errors import ConfigError
from kdcollapse.metrics import intra_inter_distances
from kdcollapse.metrics.functional import collapse_metrics_from_features
from kdcollapse.runs import Run, run_state


@torch.no_grad()
def max_logit(run_dir: Path) -> dict:
    """``{"max_logit": m}``: the largest logit of the run's last saved model on its validation split (its test
    split without one), in eval mode. The official BinaryKL form is inf/NaN once a logit passes 24·ln 2·τ."""
    run = Run(run_dir)
    split = "val" if run.config.data.val_per_class > 0 else "test"
    model, _ = run.model()
    model.eval()
    loader = make_loader(run.dataset(split), 500, train=False, device="cpu", seed=0)
    return {"max_logit": max(float(model(x).max()) for x, _ in loader)}


@torch.no_grad()
def feature_geometry(run_dir: Path) -> dict:
    """The geometry of the run's last saved model on its test split, in eval mode: ``feature_d_intra`` and
    ``feature_d_inter`` (the intra-class teacher paper's §4.2, on the L2-normalised penultimate features),
    their ratio, ``feature_vci`` and ``feature_nc1`` of the features, and ``soft_label_spread``, the
    within-class spread of the soft labels, mean ‖p(x) − p̄_y‖² with p = softmax(logits) and p̄_y its class mean."""
    run = Run(run_dir)
    test = run.dataset("test")
    model, _ = run.model()
    model.eval()
    features, logits = [], []
    for x, _ in make_loader(test, 1000, train=False, device="cpu", seed=0):
        h = model.forward_features(x)
        features.append(h)
        logits.append(model.forward_head(h))
    h, z, y = torch.cat(features), torch.cat(logits), test.labels
    d_intra, d_inter = intra_inter_distances(h, y)
    collapse = collapse_metrics_from_features(h, y, test.num_classes)
    p = z.softmax(1).double()
    class_means = torch.zeros(test.num_classes, p.shape[1], dtype=torch.float64).index_add_(0, y, p)
    class_means /= torch.bincount(y, minlength=test.num_classes)[:, None]
    return {"feature_d_intra": d_intra, "feature_d_inter": d_inter, "feature_d_ratio": d_intra / d_inter,
            "feature_vci": collapse["vci"].item(), "feature_nc1": collapse["nc1"].item(),
            "soft_label_spread": (p - class_means[y]).square().sum(1).mean().item()}


def gnc_geometry(run_dir: Path) -> dict:
    """:func:`kdcollapse.experiments.gnc_networks.gnc_geometry`: GNC1-3, NC1, the Thm 3.9 bounds and the
    eval-mode accuracies of the run's last model."""
    from kdcollapse.experiments.gnc_networks import gnc_geometry as measure

    return measure(run_dir)


def circle_geometry(run_dir: Path) -> dict:
    """:func:`kdcollapse.experiments.gnc_networks.circle_geometry`: how evenly 2-d class means and rows are
    spaced on the circle."""
    from kdcollapse.experiments.gnc_networks import circle_geometry as measure

    return measure(run_dir)


def transfer_probes(run_dir: Path) -> dict:
    """:func:`kdcollapse.experiments.vci_transfer.transfer_probes`: collapse metrics of the training features and
    linear-probe transfer (MLOG) to three unseen tasks."""
    from kdcollapse.experiments.vci_transfer import transfer_probes as measure

    return measure(run_dir)


STEPS: dict[str, Callable[[Path], dict]] = {"max_logit": max_logit, "feature_geometry": feature_geometry,
                                            "gnc_geometry": gnc_geometry, "circle_geometry": circle_geometry,
                                            "transfer_probes": transfer_probes}  # lm_collapse: added below


def ufm(seed: int, **params) -> dict:
    """The unconstrained-features model (:func:`kdcollapse.experiments.ufm.train_ufm`, ``params`` its keyword
    arguments, ``num_classes`` and ``dim`` included) from seed ``seed``: the final loss and GNC1-3, and the
    classifier's largest over smallest row norm."""
    from kdcollapse.experiments.ufm import train_ufm

    result = train_ufm(**params, seed=seed)
    norms = result.W.norm(dim=1)
    return {**{k: float(v) for k, v in result.final.items()}, "norm_ratio": float(norms.max() / norms.min())}


def distill_lm(seed: int, run_dir: Path, config: str, **overrides) -> dict:
    """A ``kdcollapse distill-lm`` run (:func:`kdcollapse.train.distill_lm`) of the config file ``config`` with
    ``overrides`` (``{"loss.divergence": "jsd", "lr": 0.001}``: the command's ``key=value`` overrides) and
    ``seed``, in ``run_dir``; an interrupted run is resumed, a start stopped before its first commit started
    again, a finished one (its ``student/`` saved) only read.
    Returns its last evaluation, the validation numbers named ``val_*`` (a study chooses on them), with the
    student's parameter count, the training tokens and the run's CPU seconds (:func:`run_cpu_seconds`)."""
    from kdcollapse.train import distill_lm as train

    run_dir = Path(run_dir)
    cfg = _lm_config(seed, run_dir, config, **overrides)
    began = time.process_time()
    trained = not (run_dir / "student").is_dir()
    if trained:
        state = run_state(run_dir)  # "new" with a config.yaml: stopped before its first commit, nothing to resume
        train(cfg, resume=state == "interrupted", overwrite=state == "new" and (run_dir / "config.yaml").is_file(),
              log=lambda line: None)
    last = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[-1])
    record = json.loads((run_dir / "run.json").read_text())
    out = {k.replace("validation_", "val_"): v for k, v in last.items() if k.startswith(("validation_", "test_"))}
    return {**out, **({"train_loss": last["train_loss"]} if "train_loss" in last else {}), "steps": last["step"],
            "student_parameters": record["student_parameters"], "train_tokens": record["train_tokens"],
            **run_cpu_seconds(run_dir, time.process_time() - began if trained else None)}


def run_cpu_seconds(run_dir: Path, this_launch: float | None) -> dict:
    """A distill-lm run's cost as its last commit records it (:meth:`kdcollapse.train.LMTrainer.cpu_seconds`):
    ``cpu_seconds``, the CPU seconds of every launch's committed part summed, and ``cpu_seconds_from_step``, the
    step they count from (0: all of it). A checkpoint of a version that kept no CPU time gives ``this_launch``
    (this process's CPU seconds, when it trained the run) counted from the first step this launch trained, or
    nothing when the run was only read; ``cpu_seconds_counted`` then says which."""
    from kdcollapse.runs import committed_path, read_header

    meta = read_header(committed_path(run_dir, "checkpoint.safetensors"))[0]
    if "cpu_seconds" in meta:
        return {"cpu_seconds": meta["cpu_seconds"], "cpu_seconds_from_step": meta.get("cpu_seconds_from_step", 0)}
    if this_launch is None:
        return {"cpu_seconds_counted": "none: its checkpoint keeps no CPU time (an older version) and it was "
                                       "not trained here"}
    return {"cpu_seconds": this_launch, "cpu_seconds_counted": "this launch only: its checkpoint keeps no CPU "
                                                               "time (an older version)"}


@torch.no_grad()
def teacher_lm(seed: int, config: str, **overrides) -> dict:
    """The teacher of a ``distill-lm`` config (the file ``config`` with ``overrides``, as :func:`distill_lm`
    reads them) evaluated once as its students are: on the same validation and test blocks, by the same
    evaluation (perplexity; its agreement with and forward KL to itself are 1 and 0 up to rounding, a check of the
    stored reference), named as :func:`distill_lm` names a student's (``val_*``, ``test_*``), with its parameter
    count and this process's CPU seconds; and what the config's top-``teacher_k`` store keeps of it on the test
    blocks (``test_top_k_coverage``, ``test_tail_mass``, ``test_uniform_tail_kl``, ``test_uniform_tail_perplexity``:
    :func:`kdcollapse.train._lm_task.top_k_costs`). The run directory is the executor's (``seed`` changes
    nothing: the evaluation draws no random number). A study's page then reads the teacher's perplexity from
    this record (e.g. the gap to the teacher that each arm closes), not from a number typed into a file."""
    from kdcollapse.train import top_k_costs

    began = time.process_time()
    cfg = _lm_config(seed, Path("unused"), config, **overrides)
    if cfg.student_tokenizer is not None:
        raise ConfigError("run step 'teacher_lm': the config distils across tokenizers, where a token perplexity "
                          "does not compare with the students'; each run's record holds the teacher's perplexity "
                          "per byte")
    task = _held_out_task(cfg)
    teacher = task.teacher.model
    out = {k.replace("validation_", "val_"): v for k, v in task.evaluate(teacher).items()}
    if cfg.teacher_k is not None and cfg.loss.temperature == 1:
        out |= {f"test_{k}": v for k, v in top_k_costs(teacher, task.held_out["test"], cfg.teacher_k,
                                                        mask=task.held_out_masks["test"]).items()}
    return {**out, "teacher": cfg.teacher, "teacher_parameters": sum(p.numel() for p in teacher.parameters()),
            "cpu_seconds": time.process_time() - began}


def _held_out_task(cfg):
    """The LM task of ``cfg`` prepared for evaluation only: the held-out blocks and the teacher's stored tokens
    its students are evaluated on (no training tokens are needed, so none are stored or loaded)."""
    import dataclasses

    from kdcollapse.train import LMTask

    task = LMTask(dataclasses.replace(cfg, loss=dataclasses.replace(cfg.loss, divergence="none", ce_weight=1.0)))
    task.prepare()
    return task


@torch.no_grad()
def lm_collapse(run_dir: Path) -> dict:
    """The next-token collapse (:func:`kdcollapse.analysis.analyze_tokens`: every hidden state, classes the next
    tokens seen at least twice, no NC4) of a finished ``distill_lm`` run's student (``student/``; a ``steps=0`` run:
    the initialisation), or of a ``teacher_lm`` run's teacher, on the run's own test blocks, the positions its
    evaluation counts: ``perplexity`` (equal to the run's ``test_perplexity``), ``cross_entropy``, ``classes``,
    ``parameters`` and ``layers`` (hidden state → metrics; a summary reads e.g. ``layers/15/nc1``), and ``last``,
    the last hidden state's metrics again (``last/nc1``: one key for models of different depths)."""
    from kdcollapse.analysis import analyze_tokens
    from kdcollapse.train import load_lm_config

    run_dir = Path(run_dir)
    result = run_dir / "result.json"
    teacher = result.is_file() and json.loads(result.read_text()).get("step") == "teacher_lm"
    if teacher:
        params = json.loads(result.read_text())["params"]
        task = _held_out_task(_lm_config(0, Path("unused"), **params))
    elif (run_dir / "student").is_dir():
        task = _held_out_task(load_lm_config(run_dir / "config.yaml", []))
    else:
        raise ConfigError(f"post step 'lm_collapse': {run_dir} holds no student/ (a finished distill_lm run saves one) "
                          "and is not a teacher_lm run")
    from kdcollapse import lm

    model = task.teacher.model if teacher else lm.load_language_model(run_dir / "student").model
    source = task.cfg.teacher if teacher else str(run_dir / "student")
    result = analyze_tokens(model, _test_batches(task), layers="all", min_count=2, ncc=False, source=source)
    layers = {str(layer): values for layer, values in result["layers"].items()}
    return {k: result[k] for k in ("perplexity", "cross_entropy", "tokens_scored", "classes", "parameters")} | {
        "layers": layers, "last": layers[str(max(map(int, layers)))]}


@torch.no_grad()
def lm_against(run_dir: Path) -> dict:
    """A finished ``distill_lm`` run's student (``student/``; a ``steps=0`` run: the initialisation) against its
    teacher on the run's test blocks (:func:`kdcollapse.analysis.analyze_tokens_against`: classes the next tokens
    seen at least twice): for each student hidden state, the teacher's after the same layer when the student was
    made of the teacher's layers (its ``run.json`` ``student_layers``), else at the nearest relative depth, with
    the Procrustes alignment and simplex angle of their class means and the linear CKA of their features (``feature_cka``)
    (``layers/<i>/...``, ``teacher_state``: the teacher's hidden state it is paired with), the top-1 agreement
    over the kept positions, and ``last``: the two last hidden states (with their classifiers' alignment)."""
    from kdcollapse import lm
    from kdcollapse.analysis import analyze_tokens_against
    from kdcollapse.train import load_lm_config

    run_dir = Path(run_dir)
    if not (run_dir / "student").is_dir():
        raise ConfigError(f"post step 'lm_against': {run_dir} holds no student/ (a finished distill_lm run saves one)")
    cfg = load_lm_config(run_dir / "config.yaml", [])
    if cfg.student_tokenizer is not None:
        raise ConfigError("post step 'lm_against': the student has a tokenizer of its own; its next-token classes "
                          "are not the teacher's")
    task = _held_out_task(cfg)
    kept = json.loads((run_dir / "run.json").read_text()).get("student_layers")
    student = lm.load_language_model(run_dir / "student").model
    result = analyze_tokens_against(student, task.teacher.model, _test_batches(task), layers="all", min_count=2,
                                    kept=kept, source=str(run_dir / "student"), teacher_source=cfg.teacher)
    layers = {}
    for pair, values in result["layers"].items():
        i, j = (int(x) for x in pair.split("/"))
        layers[str(i)] = {"teacher_state": j, **values}
    return {k: result[k] for k in ("agreement", "agreement_class_mean", "positions", "classes")} | {
        "layers": layers, "last": layers[str(max(map(int, layers)))]}


def _test_batches(task) -> list[dict]:
    """The test blocks of an LM task as ``analyze --lm`` batches of 8, labelled where its evaluation counts: position
    t predicts token t + 1."""
    from kdcollapse.losses import IGNORE_INDEX

    ids, mask = task.held_out["test"], task.held_out_masks["test"]
    labels = ids.clone()
    labels[:, 0] = IGNORE_INDEX
    labels[:, 1:][~mask] = IGNORE_INDEX
    return [{"input_ids": ids[i:i + 8], "attention_mask": torch.ones_like(ids[i:i + 8]), "labels": labels[i:i + 8]}
            for i in range(0, len(ids), 8)]


def _lm_config(seed: int, run_dir: Path, config: str, **overrides):
    """The ``distill-lm`` config of a :func:`distill_lm` step: the file ``config`` with ``overrides`` as
    ``key=value`` (their YAML forms), ``seed`` and ``run_dir``."""
    from kdcollapse.train import load_lm_config

    return load_lm_config(config, [f"{k}={yaml.safe_dump(v, default_flow_style=True).strip().removesuffix('...').strip()}"
                                   for k, v in overrides.items()] + [f"seed={seed}", f"run_dir={run_dir}"])


STEPS["lm_collapse"] = lm_collapse  # post steps of distill_lm runs
STEPS["lm_against"] = lm_against

RUN_STEPS: dict[str, Callable[..., dict]] = {"ufm": ufm, "distill_lm": distill_lm, "teacher_lm": teacher_lm}


def check_run_step(name: str, seed: int, run_dir: Path, params: dict) -> None:
    """Refuse ``params`` that run step ``name`` would refuse, without running it: a ``distill_lm`` step's config
    is read as it would train; another step's parameters must be keyword arguments of the function it calls."""
    if name in ("distill_lm", "teacher_lm"):
        if "config" not in params:
            raise ConfigError(f"run step {name!r} needs the parameter 'config' (a distill-lm config file)")
        _lm_config(seed, run_dir, **params)
        return
    if name == "ufm":
        from kdcollapse.experiments.ufm import train_ufm as function
    else:
        function = RUN_STEPS[name]
    try:
        inspect.signature(function).bind(seed=seed, **params)
    except TypeError as err:
        known = [p for p in inspect.signature(function).parameters if p != "seed"]
        raise ConfigError(f"run step {name!r}: {err}; its parameters: {', '.join(known)}") from None
