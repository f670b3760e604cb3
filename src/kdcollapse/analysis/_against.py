"""``analyze --against``: a student's collapse geometry against its teacher's, from one pass of both models over
the same batches (``kdcollapse.metrics.geometry_alignment``), at the penultimate layer and, with ``stages``, at
every pair of stages at matching relative depth; plus their per-class prediction agreement."""

from __future__ import annotations

import json
import time
from pathlib import Path

import torch
from torch import nn
from tqdm import tqdm

from kdcollapse.analysis._analyze import SOURCE_KEYS
from kdcollapse.analysis._options import AnalyzeOptions
from kdcollapse.analysis._pass import classifier_weight
from kdcollapse.analysis._source import Subject
from kdcollapse.analysis._stages import PENULTIMATE, relative_pairs, resolve_stages, stage_forward
from kdcollapse.data import make_loader
from kdcollapse.distributed import autocast, resolve_precision
from kdcollapse.errors import KdcollapseError
from kdcollapse.metrics import METRICS, FeatureStatistics, PairedFeatures, geometry_alignment
from kdcollapse.models import as_classifier, evaluating
from kdcollapse.report import markdown_table
from kdcollapse.runs import record_outputs, run_lock_for, sealed, write_text

MEANINGS = {m.name: m.meaning for m in METRICS if m.source == "geometry_alignment"}


def geometry_pass(student: nn.Module, teacher: nn.Module, batches, num_classes: int, *,
                  stages: list[int] | None = None, precision=None, progress: bool = False) -> dict:
    """One pass of ``student`` and ``teacher`` over the same ``batches`` of ``(x, y)``: ``layers`` maps
    ``"features"`` (and ``"stage<i>/stage<j>"`` for each student stage i and the teacher stage j at its relative
    depth, with ``stages``: [] for all) to :func:`geometry_alignment`'s numbers; ``agreement`` is the fraction of
    samples where both predict the same class, overall and per class."""
    student, teacher = as_classifier(student), as_classifier(teacher)
    s_stages = resolve_stages(student, stages)
    t_all = resolve_stages(teacher, [] if s_stages else None)
    stage_pairs = relative_pairs(s_stages, len(student.feature_info), len(t_all)) if s_stages else []
    t_stages = sorted({t for _, t in stage_pairs})
    pairs = [(s_stages.index(a), t_stages.index(b)) for a, b in stage_pairs]
    names = [PENULTIMATE] + [f"stage{a}/stage{b}" for a, b in stage_pairs]
    stats = paired = None
    same = torch.zeros(num_classes, dtype=torch.float64)
    seen = torch.zeros(num_classes, dtype=torch.float64)
    with evaluating([student, teacher]):
        for x, y in tqdm(batches, desc="student and teacher", disable=not progress, leave=False):
            with autocast(x.device, precision):
                hs, maps_s = stage_forward(student, x, s_stages)
                ht, maps_t = stage_forward(teacher, x, t_stages)
                zs, zt = student.forward_head(hs), teacher.forward_head(ht)
            layers = [(hs.float(), ht.float())] + [(maps_s[i], maps_t[j]) for i, j in pairs]
            if stats is None:
                stats = [(FeatureStatistics(num_classes, a.shape[1], sync_on_compute=False).to(a.device),
                          FeatureStatistics(num_classes, b.shape[1], sync_on_compute=False).to(b.device))
                         for a, b in layers]
                paired = [PairedFeatures(a.shape[1], b.shape[1], sync_on_compute=False).to(a.device) for a, b in layers]
            for (a, b), (sa, sb), pair in zip(layers, stats, paired):
                sa.update(a, y)
                sb.update(b, y)
                pair.update(a, b)
            agree = (zs.argmax(1) == zt.argmax(1)).double().cpu()
            same.index_add_(0, y.cpu(), agree)
            seen += torch.bincount(y.cpu(), minlength=num_classes).double()
    if stats is None:
        raise KdcollapseError("the split is empty: no batches to analyse")
    weights = classifier_weight(student), classifier_weight(teacher)
    out = {}
    for index, (name, (sa, sb), pair) in enumerate(zip(names, stats, paired)):
        w = weights if index == 0 and None not in weights else (None, None)
        out[name] = {k: float(v) for k, v in geometry_alignment(sa, sb, *w, paired=pair).items()}
    per_class = (same / seen.clamp_min(1)).tolist()
    return {"layers": out, "agreement": float(same.sum() / seen.sum()), "agreement_per_class": per_class}


def analyze_against(subject: Subject, teacher: nn.Module, out_dir: str | Path, options: AnalyzeOptions | None = None,
                    *, stages: list[int] | None = None, teacher_info: str | None = None) -> dict:
    """Write ``against.json`` and ``against.md`` (the student ``subject`` against ``teacher`` on the subject's
    split, :func:`geometry_pass`) to ``out_dir``; returns the JSON document."""
    options = options or AnalyzeOptions()
    model = as_classifier(subject.model, subject.features)
    device = next(model.parameters()).device
    precision = resolve_precision(options.precision, device, option="--precision")
    start = time.perf_counter()
    loader = make_loader(subject.dataset, options.batch_size, train=False, device=device, seed=0)
    result = geometry_pass(model, teacher, loader, subject.dataset.num_classes, stages=stages, precision=precision,
                           progress=options.progress)
    report = sealed({**subject.info, "teacher": teacher_info, "split": subject.split,
                     "num_samples": len(subject.dataset), "num_classes": subject.dataset.num_classes,
                     "class_names": list(subject.dataset.classes), **result,
                     "seconds": round(time.perf_counter() - start, 2)})
    out_dir = Path(out_dir)
    with run_lock_for(out_dir) as run_dir:
        out_dir.mkdir(parents=True, exist_ok=True)
        write_text(out_dir / "against.json", json.dumps(report, indent=1) + "\n")
        write_text(out_dir / "against.md", markdown_against(report))
        if run_dir is not None:
            source = {k: report[k] for k in SOURCE_KEYS if k in report} | {"split": subject.split}
            record_outputs(run_dir, [out_dir / "against.json", out_dir / "against.md"], source)
    return report


def markdown_against(report: dict) -> str:
    layers = report["layers"]
    keys = [k for k in MEANINGS if any(k in v for v in layers.values())]
    lines = [f"# Student against teacher: {report.get('run_dir') or report.get('weights')} vs {report.get('teacher')}",
             "", f"{report['split']} split, {report['num_samples']} samples, K = {report['num_classes']}; "
             f"top-1 agreement of the two models {report['agreement']:.4f}.", "",
             markdown_table(["layer", *keys], [(name, *(_number(v.get(k)) for k in keys)) for name, v in layers.items()]),
             "", "## Meanings", "", markdown_table(["key", "meaning"], [(k, MEANINGS[k]) for k in keys]),
             "## Agreement per class", "",
             markdown_table(["class", "agreement"], [(c, _number(a)) for c, a in
                                                     zip(report["class_names"], report["agreement_per_class"])])]
    return "\n".join(lines) + "\n"


def _number(value) -> str:
    return "" if value is None else f"{value:.4g}" if isinstance(value, float) else str(value)
