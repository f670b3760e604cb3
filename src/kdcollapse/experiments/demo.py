"""The demo behind ``kdcollapse demo`` (its description: :mod:`kdcollapse.cli.demo`): the plans per dataset
and the runs, analyses and report they make."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from kdcollapse.config import load_config
from kdcollapse.data import load_dataset
from kdcollapse.errors import DataError
from kdcollapse.models import count_parameters
from kdcollapse.report import markdown_table
from kdcollapse.runs import Run

# Which stage the demo is in ("[1/5] teacher: ..."); the trainer's per-epoch lines come between them.
logger = logging.getLogger("kdcollapse.demo")


@dataclass(frozen=True)
class DemoPlan:
    """Models, data sizes and epochs for one dataset, sized to finish in minutes on a 2-core CPU."""

    dataset: str
    teacher: str
    student: str
    teacher_epochs: int
    student_epochs: int
    overrides: tuple[str, ...] = ()  # shared by every run
    teacher_overrides: tuple[str, ...] = ()
    student_overrides: tuple[str, ...] = ()
    methods: tuple[str, ...] = ("kd", "dhkd", "ikl_kd")
    # The recipes' warm-up ramps (20 epochs) are longer than a demo run.
    method_overrides: dict = field(default_factory=lambda: {"ikl_kd": ("method.warmup_epochs=1",)})


PLANS = {
    "fashion_mnist": DemoPlan(
        # The teacher learns from 20,000 images; the students from 2,000 of them (200 per class).
        dataset="fashion_mnist", teacher="convnet_small", student="mlp", teacher_epochs=6, student_epochs=30,
        overrides=("data.batch_size=128", "data.crop_padding=2", "data.flip=true", "optim.lr=0.05",
                   "optim.nesterov=true", "schedule.name=cosine", "train.progress=false"),
        teacher_overrides=("data.train_per_class=2000",),
        student_overrides=("data.train_per_class=200", "model.kwargs={hidden: [64]}"),
    ),
    "digits": DemoPlan(
        dataset="digits", teacher="convnet_small", student="mlp", teacher_epochs=15, student_epochs=15,
        overrides=("data.batch_size=64", "optim.lr=0.05", "schedule.name=cosine", "train.progress=false"),
        student_overrides=("model.kwargs={input_size: 8, hidden: [32]}",),
    ),
}


_DESCRIPTION = {
    "fashion_mnist": "Fashion-MNIST: the teacher (a small CNN) learns from 20,000 training images, the students "
                     "(an MLP with one hidden layer of 64) from 2,000 of them; accuracy on the 10,000 test images.",
    "digits": "scikit-learn digits (8x8): 1,442 training and 355 test images.",
}


def quick_plan(plan: DemoPlan) -> DemoPlan:
    """``plan`` at about a tenth of its cost, for a slow or loaded machine (``kdcollapse demo --quick``): a fifth
    of the epochs, a tenth of the teacher's images, KD as the only distillation method."""
    teacher = tuple(o for o in plan.teacher_overrides if not o.startswith("data.train_per_class="))
    if any(o.startswith("data.train_per_class=") for o in plan.teacher_overrides):
        teacher += ("data.train_per_class=200",)
    return replace(plan, teacher_epochs=max(1, plan.teacher_epochs // 5), student_epochs=max(2, plan.student_epochs // 5),
                   teacher_overrides=teacher, methods=("kd",))


def choose_dataset(requested: str | None = None) -> str:
    if requested:
        return requested
    try:
        load_dataset("fashion_mnist", "test")
        return "fashion_mnist"
    except DataError:
        return "digits"


def _run(name: str, out: Path, plan: DemoPlan, model: str, method: str, epochs: int, *extra: str):
    cfg = load_config(None, [
        f"run_dir={out / name}", f"data.name={plan.dataset}", f"model.name={model}", f"method.name={method}",
        f"train.epochs={epochs}", *plan.overrides, *extra,
    ])
    from kdcollapse.train import fit  # loads the trainer: only when the demo runs, not for its --help

    start = time.perf_counter()
    result = fit(cfg, overwrite=True)
    return result, time.perf_counter() - start


def run_demo(out: Path, dataset: str | None = None, quick: bool = False) -> Path:
    """Train the plan's teacher, student baseline and distilled students; write ``out/report.md``.
    ``quick``: the :func:`quick_plan` (a few minutes where the full demo takes tens)."""
    from kdcollapse.analysis import AnalyzeOptions, analyze, load_run  # matplotlib on use: see _run
    from kdcollapse.report import plot_curves

    requested, dataset = dataset, choose_dataset(dataset)
    plan = quick_plan(PLANS[dataset]) if quick else PLANS[dataset]
    note = " (Fashion-MNIST not found: apt-get install dataset-fashion-mnist)" if requested is None and \
        dataset == "digits" else ""
    print(f"demo on {dataset}{note}; runs in {out}")
    if not quick:
        logger.info("the demo takes about 1.5 minutes on an idle 2-core CPU and can take 30 times that on a loaded "
                    "one; `kdcollapse demo --quick` (make demo DEMO_ARGS=--quick) runs a fifth of the epochs on less data")
    out.mkdir(parents=True, exist_ok=True)
    runs = {"teacher": ("teacher", plan.teacher, "vanilla", plan.teacher_epochs, plan.teacher_overrides)}
    runs["student"] = ("student", plan.student, "vanilla", plan.student_epochs, plan.student_overrides)
    for method in plan.methods:
        extra = (*plan.student_overrides, f"teacher.checkpoint={out / 'teacher'}",
                 *plan.method_overrides.get(method, ()))
        runs[f"student_{method}"] = (method, plan.student, method, plan.student_epochs, extra)
    rows, collapse, curves = [], [], {}
    started = time.perf_counter()
    for stage, (name, (label, model, method, epochs, extra)) in enumerate(runs.items(), 1):
        logger.info(f"[{stage}/{len(runs)}] {label}: training {model} with method {method} for {epochs} epochs")
        result, seconds = _run(name, out, plan, model, method, epochs, *extra)
        run = Run(result.run_dir)
        params = count_parameters(run.model()[0])
        rows.append([label, model, f"{params:,}", method, epochs, f"{result.best_acc:.2f}",
                     f"{result.last_acc:.2f}", f"{seconds:.0f}"])
        curves[label] = run.metrics()
        subject = load_run(result.run_dir, "test", device=torch.device("cpu"))
        tsne = 200 if label in ("teacher", "dhkd") else 0
        logger.info(f"[{stage}/{len(runs)}] {label}: analysing the test features" + (" (with t-SNE)" if tsne else ""))
        report = analyze(subject, Path(result.run_dir) / "analysis_test", AnalyzeOptions(
            progress=False, tsne_per_class=tsne))
        m = report["metrics"]
        collapse.append([label, m["nc1"], m["vci"], m["nc3"], m["gnc2"], m["ncc_agreement"],
                         f"[analysis]({name}/analysis_test/analysis.md)"])
        print(f"  {label:<10} {model:<14} {method:<8} test accuracy {result.last_acc:.2f}%  "
              f"NC1 {m['nc1']:.2f}  VCI {m['vci']:.3f}  ({seconds:.0f} s)")
    plot_curves(curves, ["train_loss", "test_acc"], out / "curves.png", title=f"{dataset}: training curves")
    total = time.perf_counter() - started
    report = out / "report.md"
    report.write_text(
        f"# kdcollapse demo on {dataset}\n\n"
        f"{_DESCRIPTION[dataset]} Total {total:.0f} s; each row is a run directory in `{out}`.\n\n"
        + markdown_table(["run", "model", "parameters", "method", "epochs", "best acc %", "last acc %", "time s"],
                         rows)
        + "\nOne short run per method on a subset: differences of a point or two are within seed-to-seed "
        "noise here. `results/distillation/` compares the methods over three seeds with a 93 % teacher.\n\n"
        "## Collapse of the test features (`kdcollapse analyze`)\n\n"
        "NC1 and VCI: 0 means fully collapsed; NC3: 0 means classifier and class means align; GNC2: the "
        "smallest one-vs-rest margin of the classifier; NCC agreement: how often the nearest class mean "
        "predicts what the network predicts (1 = NC4).\n\n"
        + markdown_table(["run", "NC1", "VCI", "NC3", "GNC2", "NCC agreement", "details"], collapse)
        + "\n![training curves](curves.png)\n"
    )
    print(f"report: {report}")
    return report
