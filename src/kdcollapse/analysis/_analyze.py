"""``analyze``: one pass over a split, then ``analysis.json``, ``analysis.md`` and the figures."""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from kdcollapse._optional import available, install_hint, require
from kdcollapse.analysis import _plots
from kdcollapse.analysis._logits import off_diagonal_mean_abs
from kdcollapse.analysis._options import AnalyzeOptions
from kdcollapse.analysis._pass import classifier_weight, feature_pass, ood_mean, split_metrics
from kdcollapse.analysis._source import Subject
from kdcollapse.data import make_loader
from kdcollapse.distributed import resolve_precision
from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import METRICS, collapse_metrics, covariance_spectra
from kdcollapse.models import as_classifier
from kdcollapse.report import markdown_table
from kdcollapse.runs import record_outputs, run_lock_for, sealed, write_text

logger = logging.getLogger(__name__)

FIGURES = ("spectra.png", "margins.png", "tsne.png", "logit_matrices.png", "stages.png")
# What an analysis records about the weights it measured (its provenance; Run.analysis checks it).
SOURCE_KEYS = ("run_dir", "weights", "weights_file", "epoch", "weights_sha256")

# One line per key for analysis.md: every metric's from the catalogue (definitions and papers:
# docs/metrics.md), plus the numbers the analysis pass itself adds.
MEANINGS = {m.name: m.meaning for m in METRICS} | {
    "accuracy": "fraction of samples the main head classifies correctly",
    "ncc_samples": "feature rows the NC4 rates were measured on",
    "ncc_exact": "whether those rows are the whole split (else a uniform per-class sample)",
}


def analyze(subject: Subject, out_dir: str | Path, options: AnalyzeOptions | None = None, *, ood=None) -> dict:
    """Analyse ``subject`` in one pass and write ``analysis.json``, ``analysis.md`` and PNG figures
    (spectra, margins, t-SNE, and teacher-minus-student logit matrices when there is a teacher) to
    ``out_dir``. Returns the JSON document. ``ood``: an out-of-distribution dataset (same input shape; fed
    with the subject's standardisation), whose mean feature gives NC5 (``nc5_ood_deviation``)."""
    options = options or AnalyzeOptions()
    dataset, model = subject.dataset, as_classifier(subject.model, subject.features)
    tsne_classes = _tsne_classes(options, dataset.num_classes)
    for key in ("batch_size", "sample_size"):
        value = getattr(options, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise KdcollapseError(f"{key} must be a positive int, got {value!r}")
    device = next(model.parameters()).device
    precision = resolve_precision(options.precision, device, option="--precision")
    if tsne_classes:  # before the pass: a missing extra costs nothing
        require("sklearn.manifold", "t-SNE (tsne_per_class=0 skips it)")
    figures_on = available("matplotlib")
    if not figures_on:
        logger.warning(f"analyze: no figures (matplotlib is not installed: {install_hint('matplotlib')}); "
                       "analysis.json and analysis.md are written")
    out_dir = Path(out_dir)
    with run_lock_for(out_dir) as run_dir:  # an analysis written into a run directory: never beside its trainer
        report = _analyze(subject, dataset, model, out_dir, options, precision, tsne_classes, figures_on, ood)
        if run_dir is not None:  # listed in the run's outputs.json: --overwrite removes it
            files = ["analysis.json", "analysis.md", *report["figures"].values()]
            record_outputs(run_dir, [out_dir / name for name in files], _source(report, subject.split))
    return report


def _source(report: dict, split: str) -> dict:
    """What an analysis records about the weights it measured (and its figures carry)."""
    return {k: report[k] for k in SOURCE_KEYS if k in report} | {"split": split}


def _analyze(subject: Subject, dataset, model, out_dir: Path, options: AnalyzeOptions, precision, tsne_classes,
             figures_on: bool, ood=None) -> dict:
    device = next(model.parameters()).device
    channels_last = options.channels_last and len(dataset.input_shape) == 3
    if channels_last:
        for module in (model, *subject.heads.values(), subject.teacher):
            if module is not None:
                module.to(memory_format=torch.channels_last)
    start = time.perf_counter()
    loader = make_loader(dataset, options.batch_size, train=False, device=device, seed=0)
    result = feature_pass(
        model, loader, num_classes=dataset.num_classes, heads=subject.heads, teacher=subject.teacher,
        sample_size=options.sample_size, seed=options.seed, progress=options.progress,
        description=f"{subject.split} features", precision=precision, channels_last=channels_last,
        stages=options.stages,
    )  # fmt: skip
    spectra = {k: v.tolist() for k, v in covariance_spectra(result.stats).items()}
    ood_feature = None if ood is None else ood_mean(model, ood, in_distribution=dataset,
                                                     batch_size=options.batch_size, precision=precision)
    metrics = split_metrics(result, classifier_weight(model), ood_feature)
    undefined = sorted(k for k, v in metrics.items() if isinstance(v, float) and math.isnan(v))
    if undefined:
        logger.warning(f"analyze: {', '.join(undefined)} undefined (NaN): the features have no spread to measure "
                       "(constant features, or a class with a single sample)")
    report = {
        **subject.info, "split": subject.split, "num_samples": result.num_samples,
        **({} if ood is None else {"ood": {"dataset": getattr(ood, "name", None), "samples": len(ood)}}),
        "num_classes": dataset.num_classes, "feature_dim": result.stats.feature_dim,
        "metrics": metrics,
        "margins": _margin_summary(result.margins, result.labels, dataset.classes),
        "logit_matrices": {
            name: {"mean_abs_off_diagonal": off_diagonal_mean_abs(m.compute()), "matrix": m.compute().tolist()}
            for name, m in result.logit_matrices.items()
        },
        "spectra": spectra,
    }  # fmt: skip
    if result.stages:  # every metric of each stage's pooled map, then the penultimate features (its metrics above)
        report["stages"] = {name: {k: float(v) if v.is_floating_point() else int(v)
                                   for k, v in collapse_metrics(st).items()} | {"channels": st.feature_dim}
                            for name, st in result.stages.items()}
    title = f"{report.get('model')} ({report.get('method')}) · {report.get('dataset')} {subject.split}"
    source = _source(report, subject.split)
    out_dir.mkdir(parents=True, exist_ok=True)  # after the pass: a failed pass leaves no folder
    figures = {}
    if figures_on:
        figures["spectra"] = _plots.plot_spectra(spectra, int(report["metrics"]["vci_rank"]), out_dir / "spectra.png",
                                                 title, source)
        figures["margins"] = _plots.plot_margins(result.margins.numpy(), result.labels.numpy(), dataset.classes,
                                                 out_dir / "margins.png", title, source)
    if figures_on and result.stages:
        figures["stages"] = _plots.plot_stages(report["stages"], metrics, out_dir / "stages.png", title, source)
    if tsne_classes:
        index = result.sample.first(options.tsne_per_class, tsne_classes)
        with stage(f"t-SNE of {index.numel()} points", options.progress):
            embedding = tsne(result.sample.columns["features"][index].numpy(), options.seed)
        labels = result.sample.labels[index].numpy()
        if figures_on:
            figures["tsne"] = _plots.plot_tsne(embedding, labels, dataset.classes, out_dir / "tsne.png", title, source)
        report["tsne"] = tsne_record(embedding, labels, result.sample.columns["index"][index].numpy(), tsne_classes,
                                     dataset.classes)
    if report["logit_matrices"] and figures_on:
        figures["logit_matrices"] = _plots.plot_logit_matrices(
            {k: np.array(v["matrix"]) for k, v in report["logit_matrices"].items()},
            out_dir / "logit_matrices.png", f"|M_teacher − M_student| per head · {title}", source,
        )  # fmt: skip
    report["figures"] = figures
    report["seconds"] = round(time.perf_counter() - start, 2)
    for name in set(FIGURES) - set(figures.values()):  # a figure of an earlier analysis would describe other data
        (out_dir / name).unlink(missing_ok=True)
    report = sealed(report)  # its content_sha256: a hand edit is detected when it is read
    write_text(out_dir / "analysis.json", json.dumps(report, indent=1) + "\n")
    write_text(out_dir / "analysis.md", markdown_report(report))
    return report


@contextlib.contextmanager
def stage(description: str, progress: bool) -> Iterator[None]:
    """Show ``description`` and the time it has taken, refreshed every second, while the block runs (a step
    without iterations of its own, such as t-SNE, would otherwise look stuck or finished)."""
    if not progress:
        yield
        return
    done = threading.Event()
    with tqdm(total=1, desc=description, bar_format="{desc}: {elapsed}", leave=False) as bar:
        def tick() -> None:
            while not done.wait(1.0):
                bar.refresh()

        ticker = threading.Thread(target=tick, daemon=True)
        ticker.start()
        try:
            yield
        finally:
            done.set()
            ticker.join()


def meaning(key: str) -> str:
    """One line on what a metric key of ``analysis.json`` or ``metrics.jsonl`` measures."""
    if key.startswith("accuracy_"):
        return f"fraction of samples the {key.removeprefix('accuracy_')} head classifies correctly"
    return MEANINGS.get(key, "")


def _tsne_classes(options: AnalyzeOptions, num_classes: int) -> list[int]:
    if options.tsne_per_class < 0:
        raise KdcollapseError(f"tsne_per_class must be >= 0, got {options.tsne_per_class}")
    classes = options.tsne_classes if options.tsne_classes is not None else list(range(min(num_classes, 10)))
    bad = [c for c in classes if not 0 <= c < num_classes]
    if bad or not classes:
        raise KdcollapseError(f"t-SNE classes must be indices in 0..{num_classes - 1}, got {classes}")
    return sorted(set(classes)) if options.tsne_per_class else []


def tsne(features: np.ndarray, seed: int) -> np.ndarray:
    """2-D t-SNE (scikit-learn, PCA initialisation) of ``(n, d)`` features; perplexity 30 or less for
    small ``n``."""
    TSNE = require("sklearn.manifold", "t-SNE").TSNE
    n = features.shape[0]
    if n < 3:
        raise KdcollapseError(f"t-SNE needs at least 3 points, the sample holds {n}")
    perplexity = min(30.0, (n - 1) / 3)
    return TSNE(n_components=2, perplexity=perplexity, init="pca", random_state=seed).fit_transform(features)


def tsne_record(embedding: np.ndarray, labels: np.ndarray, index: np.ndarray, classes: list[int],
                names: list[str]) -> dict:
    """What ``analysis.json`` keeps of a t-SNE: the classes and their names, and per point its position in the
    analysed split (``index``: loader order, from 0), its label and its 2-D coordinates rounded to 0.001 (far below
    a figure's resolution), so that a study's ``kind: embeddings`` plot redraws it from the report alone."""
    return {"classes": classes, "class_names": [names[c] for c in classes], "points": int(len(labels)),
            "index": [int(i) for i in index], "labels": [int(c) for c in labels],
            "embedding": [[round(float(x), 3), round(float(y), 3)] for x, y in embedding]}


def _margin_summary(margins: torch.Tensor, labels: torch.Tensor, classes: list[str]) -> dict:
    """Mean, median, 5th percentile and the fraction of negative margins, overall and per class."""

    def summary(values: torch.Tensor) -> dict:
        values = values.double()
        return {"count": values.numel(), "mean": float(values.mean()), "median": float(values.quantile(0.5)),
                "p05": float(values.quantile(0.05)), "negative": float((values < 0).double().mean())}

    per_class = [{"class": name, **summary(margins[labels == k])} for k, name in enumerate(classes)]
    return {"all": summary(margins), "per_class": per_class}


def markdown_report(report: dict) -> str:
    """``analysis.md``: what was analysed, every metric with its meaning, margins, logit matrices, figures."""
    where = report.get("run_dir") or report.get("weights")
    lines = [
        f"# Collapse analysis: {report.get('model')} ({report.get('method')}) on {report.get('dataset')} "
        f"{report['split']}",
        "",
        f"`{where}`, epoch {report.get('epoch')}" + (f" (weights sha256 `{report['weights_sha256'][:16]}`)" if
                                                     report.get("weights_sha256") else "") +
        f": {report['num_samples']} samples, K = {report['num_classes']} "
        f"classes, d = {report['feature_dim']} features" + (f", teacher `{report['teacher']}`" if
                                                            report.get("teacher") else "") + ".",
        "",
        "## Collapse metrics",
        "",
        markdown_table(["metric", "value", "meaning"],
                       [(k, _number(v), meaning(k)) for k, v in report["metrics"].items()]),
        "## Logit margins per class (main head)",
        "",
        markdown_table(["class", "samples", "mean", "median", "5th pct", "negative"],
                       [(m["class"], m["count"], *map(_number, (m["mean"], m["median"], m["p05"], m["negative"])))
                        for m in [*report["margins"]["per_class"], {**report["margins"]["all"], "class": "all"}]]),
    ]  # fmt: skip
    if report.get("stages"):
        keys = [k for k in STAGE_KEYS if k in report["metrics"]]
        rows = [(name, values["channels"], *(_number(values[k]) for k in keys)) for name, values in report["stages"].items()]
        rows.append(("features", report["feature_dim"], *(_number(report["metrics"][k]) for k in keys)))
        lines += ["## Stage by stage (pooled stage maps, then the penultimate features)", "",
                  markdown_table(["layer", "channels", *keys], rows)]
    if report["logit_matrices"]:
        lines += [
            "## Teacher − student class logit matrices (DHKD App. H)",
            "",
            "M[k, j] = mean logit j over samples of true class k; the figure shows |M_teacher − M_student| "
            "off the diagonal. Smaller = the head reproduces more of the teacher's class-to-class structure.",
            "",
            markdown_table(["head", "mean abs off-diagonal", "max abs off-diagonal"],
                           [(name, _number(v["mean_abs_off_diagonal"]), _number(_off_diagonal_max(v["matrix"])))
                            for name, v in report["logit_matrices"].items()]),
        ]  # fmt: skip
    lines += ["## Figures", ""] + ([f"![{name}]({file})" for name, file in report["figures"].items()]
                                   or [f"None: matplotlib was not installed ({install_hint('matplotlib')})."])
    lines += ["", f"One pass, {report['seconds']} s.", ""]
    return "\n".join(lines)


STAGE_KEYS = ("nc1", "vci", "nc2_etf_error", "nc2g_log_var", "cdnv", "class_separation")  # analysis.md's stage table


def _number(value) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _off_diagonal_max(matrix: list[list[float]]) -> float:
    m = np.abs(np.array(matrix))
    np.fill_diagonal(m, -math.inf)
    return float(m.max())
