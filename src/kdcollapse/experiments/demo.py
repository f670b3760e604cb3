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
    # The recipes' warm-up ramps (20 epochs) are longer than a demo run; KD reads the teacher's logits once
    # (teacher.cache=logits: the students train without augmentation).
    method_overrides: dict = field(default_factory=lambda: {"ikl_kd": ("method.warmup_epochs=1",),
                                                            "kd": ("teacher.cache=logits",)})
    committed_teacher: str | None = None  # a teacher run directory of the repository, reused when present
    quick_teacher_epochs: int = 1
    quick_teacher_overrides: tuple[str, ...] = ()


# The students learn from few images (50 or 10 per class), where a teacher's soft labels carry the most:
# over seeds 0-2 KD beat the student alone in every seed (docs/distillation.md#the-demo).
PLANS = {
    "fashion_mnist": DemoPlan(
        dataset="fashion_mnist", teacher="convnet_small", student="mlp", teacher_epochs=6, student_epochs=20,
        overrides=("data.batch_size=64", "optim.lr=0.05", "schedule.name=cosine", "train.progress=false"),
        teacher_overrides=("data.train_per_class=2000", "optim.nesterov=true", "data.batch_size=128", "data.crop_padding=2",
                           "data.flip=true"),
        student_overrides=("data.train_per_class=50", "model.kwargs={hidden: [64]}"),
        committed_teacher="results/teachers/fashion_mnist_convnet",  # convnet, 92.88 % (its README)
        quick_teacher_epochs=2, quick_teacher_overrides=("data.train_per_class=500", "data.batch_size=128"),
    ),
    "digits": DemoPlan(
        dataset="digits", teacher="convnet_small", student="mlp", teacher_epochs=10, student_epochs=30,
        overrides=("data.batch_size=64", "optim.lr=0.05", "schedule.name=cosine", "train.progress=false"),
        student_overrides=("data.train_per_class=10", "model.kwargs={input_size: 8, hidden: [32]}"),
        quick_teacher_epochs=3,
    ),
}


_DESCRIPTION = {
    "fashion_mnist": "Fashion-MNIST: the students (an MLP with one hidden layer of 64) learn from 500 training "
                     "images (50 per class); accuracy on the 10,000 test images.",
    "digits": "UCI digits (8x8, shipped with kdcollapse): the teacher learns from the 1,442 training images, the "
              "students from 100 of them (10 per class); accuracy on the 355 test images.",
}


def quick_plan(plan: DemoPlan) -> DemoPlan:
    """``plan`` for a slow or loaded machine (``kdcollapse demo --quick``): a teacher trained shorter on less
    data (when none is committed), KD as the only distillation method; the students' runs are unchanged."""
    return replace(plan, teacher_epochs=plan.quick_teacher_epochs,
                   teacher_overrides=plan.quick_teacher_overrides or plan.teacher_overrides, methods=("kd",))


def committed_teacher(plan: DemoPlan) -> Path | None:
    """The repository's committed teacher of ``plan`` (a git checkout has it; a pip install has not)."""
    if plan.committed_teacher is None:
        return None
    path = Path(__file__).resolve().parents[3] / plan.committed_teacher
    return path if (path / "model.safetensors").is_file() and (path / "run.json").is_file() else None


def choose_dataset(requested: str | None = None) -> str:
    if requested:
        return requested
    try:
        load_dataset("fashion_mnist", "test")
        return "fashion_mnist"
    except DataError:
        return "digits"


# What three seeds (0-2) of each plan measured (docs/distillation.md#the-demo): KD minus the student alone, in
# points of test accuracy, mean and range. One run of the demo is one seed.
MEASURED = {"fashion_mnist": (1.03, 0.85, 1.14), "digits": (2.72, 1.12, 4.79)}


def kd_verdict(accuracy: dict[str, float], dataset: str) -> str:
    """The report's sentence on KD against the student alone, following this run's numbers."""
    if "kd" not in accuracy or "student" not in accuracy:
        return ""
    gain = accuracy["kd"] - accuracy["student"]
    mean, low, high = MEASURED[dataset]
    seeds = (f"over seeds 0-2 of this plan KD gained {mean:+.2f} points on average ({low:+.2f} to {high:+.2f}; "
             "docs/distillation.md#the-demo)")
    if gain > 0:
        return f"KD beats the student alone by {gain:.2f} points of test accuracy in this run (one seed); {seeds}."
    return (f"KD does not beat the student alone in this run ({gain:+.2f} points, one seed), unlike the three "
            f"seeds measured: {seeds}.")


def _skipped_extras() -> list[str]:
    """What a core install (without the ``analysis`` extra) leaves out, one line each."""
    from kdcollapse._optional import available, install_hint

    missing = [name for name in ("matplotlib", "sklearn") if not available(name)]
    if not missing:
        return []
    return [f"figures and t-SNE ({' and '.join('scikit-learn' if m == 'sklearn' else m for m in missing)} "
            f"not installed: {install_hint(missing[0])})"]


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
        logger.info("the demo takes a few minutes on an idle 2-core CPU and can take 30 times that on a loaded "
                    "one; `kdcollapse demo --quick` (make demo DEMO_ARGS=--quick) trains a shorter teacher, KD only")
    skipped = _skipped_extras()
    for line in skipped:
        print(f"  skipped: {line}")
    out.mkdir(parents=True, exist_ok=True)
    reused = committed_teacher(plan)
    teacher_dir = reused or out / "teacher"
    runs = {} if reused else {"teacher": ("teacher", plan.teacher, "vanilla", plan.teacher_epochs,
                                          plan.teacher_overrides)}
    runs["student"] = ("student", plan.student, "vanilla", plan.student_epochs, plan.student_overrides)
    for method in plan.methods:
        extra = (*plan.student_overrides, f"teacher.checkpoint={teacher_dir}", *plan.method_overrides.get(method, ()))
        runs[f"student_{method}"] = (method, plan.student, method, plan.student_epochs, extra)
    rows, collapse, curves, accuracy = [], [], {}, {}
    started = time.perf_counter()
    if reused:
        run = Run(reused)
        logger.info(f"teacher: reusing the committed {reused} (its README says how it was trained)")
        rows.append(["teacher", run.config.model.name, f"{count_parameters(run.model()[0]):,}", "vanilla (committed)",
                     run.config.train.epochs, "", f"{run.metrics()[-1]['test_acc']:.2f}", "0"])
    for stage, (name, (label, model, method, epochs, extra)) in enumerate(runs.items(), 1):
        logger.info(f"[{stage}/{len(runs)}] {label}: training {model} with method {method} for {epochs} epochs")
        result, seconds = _run(name, out, plan, model, method, epochs, *extra)
        run = Run(result.run_dir)
        params = count_parameters(run.model()[0])
        accuracy[label] = result.last_acc
        rows.append([label, model, f"{params:,}", method, epochs, f"{result.best_acc:.2f}",
                     f"{result.last_acc:.2f}", f"{seconds:.0f}"])
        curves[label] = run.metrics()
        subject = load_run(result.run_dir, "test", device=torch.device("cpu"))
        tsne = 200 if label in ("teacher", "dhkd") and not skipped else 0
        logger.info(f"[{stage}/{len(runs)}] {label}: analysing the test features" + (" (with t-SNE)" if tsne else ""))
        report = analyze(subject, Path(result.run_dir) / "analysis_test", AnalyzeOptions(
            progress=False, tsne_per_class=tsne))
        m = report["metrics"]
        collapse.append([label, m["nc1"], m["vci"], m["nc3"], m["gnc2"], m["ncc_agreement"],
                         f"[analysis]({name}/analysis_test/analysis.md)"])
        print(f"  {label:<10} {model:<14} {method:<8} test accuracy {result.last_acc:.2f}%  "
              f"NC1 {m['nc1']:.2f}  VCI {m['vci']:.3f}  ({seconds:.0f} s)")
    if not skipped:
        plot_curves(curves, ["train_loss", "test_acc"], out / "curves.png", title=f"{dataset}: training curves")
    total = time.perf_counter() - started
    verdict = kd_verdict(accuracy, dataset)
    print(f"  {verdict}")
    report = out / "report.md"
    teacher_line = f"The teacher is the committed `{reused}`. " if reused else ""
    report.write_text(
        f"# kdcollapse demo on {dataset}\n\n"
        f"{_DESCRIPTION[dataset]} {teacher_line}Total {total:.0f} s; each row is a run directory in `{out}`.\n\n"
        + markdown_table(["run", "model", "parameters", "method", "epochs", "best acc %", "last acc %", "time s"],
                         rows)
        + f"\n{verdict} `results/distillation/` compares the methods over three seeds with a 93 % teacher.\n\n"
        + "".join(f"Skipped: {line}.\n\n" for line in skipped)
        + "## Collapse of the test features (`kdcollapse analyze`)\n\n"
        "NC1 and VCI: 0 means fully collapsed; NC3: 0 means classifier and class means align; GNC2: the "
        "smallest one-vs-rest margin of the classifier; NCC agreement: how often the nearest class mean "
        "predicts what the network predicts (1 = NC4).\n\n"
        + markdown_table(["run", "NC1", "VCI", "NC3", "GNC2", "NCC agreement", "details"], collapse)
        + ("" if skipped else "\n![training curves](curves.png)\n")
    )
    print(f"report: {report}")
    return report
