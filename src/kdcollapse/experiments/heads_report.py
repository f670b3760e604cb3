"""The report of ``kdcollapse geometry heads-report``: the GNC paper's class-assignment runs on Fashion-MNIST.

Reads the runs of the study ``configs/geometry/study.yaml`` (``kdcollapse study run ... --runs-dir RUNS``):
``RUNS/assignment/<name>/seed<N>``, GNC Section 4 / Fig. 4, four classes in d = 2, the trainable cosine head
(``trainable``) against fixed square codes with three class assignments (``A1``, ``A2``, ``A3``); measures GNC1-3
of every trained model with :mod:`kdcollapse.metrics` and writes ``assignment.md`` with its figures. (The heads of
Fig. 5 are a study with a generated page: results/geometry/heads/study.yaml.)
"""

from __future__ import annotations

import json
import math
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from kdcollapse.config import RunConfig
from kdcollapse.data import make_loader
from kdcollapse.errors import KdcollapseError
from kdcollapse.experiments.plots import plot_features_2d
from kdcollapse.models import Classifier
from kdcollapse.report import machine
from kdcollapse.runs import Run, metrics_source

ORDER = ("trainable", "A1", "A2", "A3")  # table order; other names follow, sorted


@dataclass
class TrainedRun:
    """One finished run: its name (the folder above ``seed<N>``), seed, config, model, class names and
    epoch records."""

    name: str
    seed: int
    run: Run
    model: Classifier
    classes: list[str]
    records: list[dict]

    @property
    def path(self) -> Path:
        return self.run.dir

    @property
    def cfg(self) -> RunConfig:
        return self.run.config

    @property
    def test_acc(self) -> float:
        return self.records[-1]["test_acc"]


def write_heads_report(runs: str | Path, out: str | Path) -> list[Path]:
    """Write ``assignment.md`` (and figures) into ``out`` from the runs under ``runs``."""
    runs, out = Path(runs), Path(out)
    parts = {"assignment": _assignment_section}
    found = [name for name in parts if (runs / name).is_dir()]
    if not found:
        raise KdcollapseError(f"{runs} holds no assignment/ (see configs/geometry/study.yaml)")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name in found:
        group = load_runs(runs / name)
        lines = [*_header(name, runs, group), *parts[name](group, out), *_sources(group)]
        path = out / f"{name}.md"
        path.write_text("\n".join(lines) + "\n")
        written.append(path)
    return written


def load_runs(root: Path) -> dict[str, list[TrainedRun]]:
    """Every ``root/<name>/seed<N>`` run, grouped by name (sorted), seeds ascending."""
    groups: dict[str, list[TrainedRun]] = {}
    for model_file in sorted(root.glob("*/seed*/model.safetensors"), key=lambda p: (_rank(p.parts[-3]), _seed(p))):
        opened = Run(model_file.parent)
        model, meta = opened.model()
        run = TrainedRun(opened.dir.parent.name, _seed(model_file), opened, model.eval(), meta["classes"],
                         opened.metrics())
        groups.setdefault(run.name, []).append(run)
    if not groups:
        raise KdcollapseError(f"no runs under {root} (expected <name>/seed<N>/model.safetensors)")
    return groups


def _rank(name: str) -> tuple[int, str]:
    return (ORDER.index(name), "") if name in ORDER else (len(ORDER), name)


def _seed(model_file: Path) -> int:
    return int(model_file.parent.name.removeprefix("seed"))


@torch.no_grad()
def features(run: TrainedRun, split: str) -> tuple[Tensor, Tensor]:
    """``forward_features`` of ``split`` as the run saw it (its class selection and subsets), labels."""
    dataset = run.run.dataset(split)
    loader = make_loader(dataset, 1000, train=False, device="cpu", seed=0)
    pairs = [(run.model.forward_features(x), y) for x, y in loader]
    return torch.cat([h for h, _ in pairs]), torch.cat([y for _, y in pairs])


def gnc_metrics(run: TrainedRun, split: str) -> dict[str, float]:
    """GNC1-3 (GNC Section 2.2) of the run's ``split`` features with its head's class vectors."""
    from kdcollapse.metrics.functional import collapse_metrics_from_features

    H, y = features(run, split)
    metrics = collapse_metrics_from_features(H, y, run.model.num_classes, run.model.head.weight)
    return {name: float(metrics[name]) for name in ("gnc1", "gnc2", "gnc3")}


def circular_order(W: Tensor) -> list[int]:
    """Classes sorted by the angle of their class vector (d = 2): neighbours in the list are adjacent."""
    angles = torch.atan2(W[:, 1].double(), W[:, 0].double())
    return angles.argsort().tolist()


def opposite_pairs(W: Tensor) -> frozenset[frozenset[int]]:
    """For four class vectors in d = 2: the two pairs of classes that are not adjacent on the circle."""
    if W.shape != (4, 2):
        raise KdcollapseError(f"opposite_pairs needs 4 class vectors in d = 2, got {tuple(W.shape)}")
    a, b, c, d = circular_order(W)
    return frozenset({frozenset({a, c}), frozenset({b, d})})


# ------------------------------------------------------------------------------------- sections
def _header(name: str, runs: Path, group: dict[str, list[TrainedRun]]) -> list[str]:
    title = {"assignment": "The class-assignment problem (GNC paper Section 4, Fig. 4) on Fashion-MNIST"}[name]
    first = next(iter(group.values()))[0]
    seconds = sum(r["epoch_time_s"] for runs in group.values() for run in runs for r in run.records)
    seeds = sorted({run.seed for runs in group.values() for run in runs})
    revisions = sorted({_run_info(run).get("git_revision") or "not recorded (run outside a git checkout)"
                        for runs in group.values() for run in runs})
    return [
        f"# {title}",
        "",
        f"Runs: `kdcollapse study run configs/geometry/study.yaml --runs-dir {runs}` (configs "
        f"`configs/geometry/fmnist_{name}.yaml`), "
        f"then `kdcollapse geometry heads-report --runs {runs} --out <this folder>`. Seeds {seeds}. "
        f"Training: {seconds / 60:.1f} min of epochs in total, one thread per run (OMP_NUM_THREADS=1) on "
        f"{machine()} ({os.cpu_count()} cores, shared with other jobs); code revision of the runs (run.json): "
        f"{', '.join(revisions)}.",
        "",
        f"Model: `{first.cfg.model.name}` {first.cfg.model.kwargs} (the feature is the linear bottleneck), "
        f"{first.cfg.train.epochs} epochs, batch {first.cfg.data.batch_size}, SGD lr {first.cfg.optim.lr} "
        f"(momentum {first.cfg.optim.momentum}, weight decay {first.cfg.optim.weight_decay}), "
        f"{first.cfg.schedule.name} schedule after a {first.cfg.schedule.warmup_epochs:g}-epoch linear warm-up, "
        "no augmentation. "
        "Accuracies are after the last epoch. GNC1 and GNC3 on the normalised features of the whole split, "
        "GNC2 = rho one-vs-rest of the head's unit class vectors (`kdcollapse.metrics`).",
        "",
    ]


def _sources(group: dict[str, list[TrainedRun]]) -> list[str]:
    """What every number above was measured from: each run's committed epoch and weights checksum."""
    lines = ["", "Sources: the committed epoch and weights (SHA-256 as `state.json` records it, first 16 hex digits) "
             "of each run measured above.", ""]
    for runs in group.values():
        for run in runs:
            source = metrics_source(run.path)
            lines.append(f"- `{run.name}/seed{run.seed}`: epoch {source['epoch']}, weights "
                         f"`{(source['weights_sha256'] or 'not recorded')[:16]}`")
    return lines


def _run_info(run: TrainedRun) -> dict:
    path = run.path / "run.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def _assignment_section(group: dict[str, list[TrainedRun]], out: Path) -> list[str]:
    first = next(iter(group.values()))[0]
    names = first.classes
    fixed = {name: opposite_pairs(runs[0].model.head.weight) for name, runs in group.items() if name != "trainable"}

    def describe(pairs) -> str:
        text = ", ".join(" / ".join(names[k] for k in sorted(p)) for p in sorted(pairs, key=min))
        same = [name for name, p in fixed.items() if p == pairs]
        return text + (f" (= {same[0]})" if same else "")

    lines = [
        f"Classes {first.cfg.data.classes} of Fashion-MNIST: {', '.join(names)} (labels 0-3). d = 2: the softmax "
        "code is the square (Thm 3.3, rho = 1); a fixed head puts class c on row assignment[c] of the square "
        "(rows at 0, 90, 180, 270 degrees). The four classes form two similar pairs, "
        f"{names[0]} / {names[1]} and {names[2]} / {names[3]}.",
        "",
        _row("head", "assignment", "opposite classes (not adjacent)", "test acc % per seed", "mean ± std"),
        _row(*["---"] * 5),
    ]
    for name, runs in group.items():
        accs = [run.test_acc for run in runs]
        if name == "trainable":
            pairs = sorted({describe(opposite_pairs(run.model.head.weight)) for run in runs})
            arrangement, assignment = "; ".join(pairs), "learned"
        else:
            arrangement, assignment = describe(fixed[name]), str(runs[0].cfg.method.assignment)
        lines.append(_row(name, assignment, arrangement, ", ".join(f"{a:.2f}" for a in accs), _mean_std(accs)))
    lines += ["", "Learned heads, per seed (classes in counter-clockwise order; angles between neighbours; GNC2 of W):", ""]
    for run in group.get("trainable", []):
        W = run.model.head.weight.detach().double()
        order = circular_order(W)
        angles = torch.atan2(W[order, 1], W[order, 0])
        gaps = [math.degrees((angles[(i + 1) % 4] - angles[i]).item()) % 360 for i in range(4)]
        gnc = gnc_metrics(run, "train")
        lines.append(f"* seed {run.seed}: {' → '.join(names[k] for k in order)}; angles "
                     f"{', '.join(f'{g:.1f}' for g in gaps)} degrees; GNC1 {_fmt(gnc['gnc1'])}, GNC2 {_fmt(gnc['gnc2'])}, "
                     f"GNC3 {_fmt(gnc['gnc3'])}; test acc {run.test_acc:.2f} %")
    figures = []
    panels = [(f"{name}, seed {runs[0].seed}: {runs[0].test_acc:.2f} %", *features(runs[0], "test"),
               runs[0].model.head.weight) for name, runs in group.items()]
    figures.append(plot_features_2d(panels, names, out / "assignment_features.png"))
    if "trainable" in group:
        panels = [(f"trainable, seed {run.seed}: {run.test_acc:.2f} %", *features(run, "test"), run.model.head.weight)
                  for run in group["trainable"]]
        figures.append(plot_features_2d(panels, names, out / "assignment_trainable_seeds.png"))
    return lines + ["", *[f"![{p.stem}]({p.name})" for p in figures], ""]


def _row(*cells) -> str:
    return "| " + " | ".join(str(c) for c in cells) + " |"


def _fmt(x: float) -> str:
    return f"{x:.3g}" if abs(x) < 1e-3 else f"{x:.4f}"


def _mean_std(values: list[float]) -> str:
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return f"{statistics.mean(values):.2f} ± {spread:.2f}"
