"""What every recipe table shares: a teacher -> student pair, the CIFAR-100 and ImageNet solvers, the
stages after the stem, and the rendering of a recipe file."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]  # configs/


@dataclass(frozen=True)
class Pair:
    teacher: str
    student: str
    paper: dict  # method -> published top-1 (%); None where our copy of the paper has no number
    dkd_beta: float  # mdistiller's per-pair NCKD weight
    dhkd_alpha: float
    ikl: tuple[float, float]  # (mse_weight, soft_ce_weight) = official (BETA, ALPHA)
    cross_arch: bool = False  # DHKD Table 2: non-linear auxiliary head; lr 0.01 for the light students
    alpha_note: str = "the paper picks alpha from {0.5, 1, 2} per pair without publishing which; 1 here"


# mdistiller's feature lists, as feature_info stages: "feats[1:]" (every stage after the stem) of the CIFAR
# models (3 for the ResNets, WRNs and ShuffleNets, 4 for VGG, MobileNetV2 and ResNet50) and of the
# ImageNet ResNets; its MobileNetV1 lists start at our stage 2 (the 128-channel map), and its ImageNet
# ResNets have OFD margins for layer2-layer4 only.
FIVE_STAGES = ("vgg13", "vgg8", "mobilenetv2", "resnet50_cifar")


def after_stem(model: str) -> list[int]:
    return [1, 2, 3, 4] if model in FIVE_STAGES else [1, 2, 3]


def student_lr(student: str) -> float:
    """The CIFAR-100 learning rate of a student: 0.01 for the light ones of DHKD Table 2, else 0.05."""
    return 0.01 if student in ("shufflev1", "shufflev2", "mobilenetv2") else 0.05


def cifar_common(student: str, run_dir: str, lr: float) -> dict:
    return {
        "run_dir": run_dir,
        "seed": 0,
        "data": {"name": "cifar100", "batch_size": 64, "crop_padding": 4, "flip": True},
        "model": {"name": student},
        "optim": {"lr": lr, "momentum": 0.9, "weight_decay": 5.0e-4},
        "schedule": {"name": "multistep", "milestones": [150, 180, 210], "gamma": 0.1},
        "train": {"epochs": 240},
    }


# (batch in total, lr) of the official ImageNet configs where they differ from (256, 0.1): mdistiller's
# r34_r18 / r50_mv1 KD, DKD and AT files and DKL's IKL-KD files (512, 0.2), MLKD's kd_ours (512, 0.1) and
# mdistiller's r50_mv1/ofd.yaml (128, 0.05).
IMAGENET_SOLVER = {**{(m, s): (512, 0.2) for m in ("kd", "dkd", "at", "ikl_kd") for s in ("resnet18", "mobilenetv1")},
                   ("mlkd", "resnet18"): (512, 0.1), ("ofd", "mobilenetv1"): (128, 0.05)}


def imagenet_common(model: str, run_dir: str, method: str = "vanilla") -> dict:
    batch, lr = IMAGENET_SOLVER.get((method, model), (256, 0.1))
    return {
        "run_dir": run_dir,
        "seed": 0,
        # batch_size is per process: the official batch in total, so batch / 8 per process with torchrun
        # --nproc_per_node=8 (the header's command).
        "data": {"name": "imagenet", "batch_size": batch, "flip": True, "num_workers": 16},
        "model": {"name": model},
        "optim": {"lr": lr, "momentum": 0.9, "weight_decay": 1.0e-4},
        "schedule": {"name": "multistep", "milestones": [30, 60, 90], "gamma": 0.1},
        "train": {"epochs": 100},
    }


def per_gpu(body: dict) -> int:
    return body["data"]["batch_size"] // 8


_ORDER = ("run_dir", "seed", "data", "model", "teacher", "method", "optim", "schedule", "train")


def order(body: dict) -> dict:
    return {key: body[key] for key in _ORDER if key in body} | {k: v for k, v in body.items() if k not in _ORDER}


def student_solver(area: str, student: str, run_dir: str, method: str) -> dict:
    """A student recipe's solver: CIFAR-100's at :func:`student_lr`, or ImageNet's of ``method``."""
    if area == "cifar100":
        return cifar_common(student, run_dir, student_lr(student))
    return imagenet_common(student, run_dir, method)


def student_recipe(area: str, method: str, teacher: str, student: str, body: dict,
                   header: list[str]) -> dict[Path, str]:
    """The CIFAR-100 or ImageNet (``area``) recipe of ``method`` distilling ``teacher`` into ``student``, {its path
    under configs/: its text}: ``body`` with that teacher's checkpoint, ``header`` then the command to run it."""
    stem = f"{teacher}_{student}"
    body["teacher"] = {"checkpoint": f"runs/{area}/teacher_{teacher}"}
    if area == "cifar100":
        command = f"kdcollapse distill --config configs/cifar100/{method}/{stem}.yaml --seeds 0,1,2"
    else:
        command = (f"torchrun --nproc_per_node=8 -m kdcollapse distill --config configs/imagenet/{method}/"
                   f"{stem}.yaml data.batch_size={per_gpu(body)}")
    return {Path(area) / method / f"{stem}.yaml": render([*header, command], order(body))}


def render(header: list[str], body: dict) -> str:
    """A recipe file: ``header`` as comment lines, then ``body`` (configs/generate.py adds the line naming the
    table it is written from)."""
    comments = "".join(f"# {line}\n" for line in header)
    return comments + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=120)

