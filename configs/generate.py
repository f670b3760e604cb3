"""Write every distillation recipe under configs/ from the tables below.

    python configs/generate.py          # (re)write configs/cifar100, imagenet, fashion_mnist, fashion_mnist_pairs
    python configs/generate.py --check  # exit 1 if a committed recipe differs from this script's output

One row per teacher -> student pair; the methods' official hyperparameters are filled in here, once,
so the recipes cannot drift apart. Each file names the paper number it should reproduce in its header.
Sources: DHKD paper Tables 1-4, App. F, J (Table 11); DKL paper Tables 3, 5; mdistiller's DKD configs;
the official DKL/IKL code (see docs/distillation.md); for NKD, WTTM, CTKD, MLKD and logit standardization
their official repositories (logit_recipes below); configs/provenance.py names the official file and commit
each CIFAR-100/ImageNet recipe follows and its deliberate deviations (tests/test_official_recipes.py checks
every field against tests/data/official_recipes.yaml); for the baselines of issue 23, mdistiller's configs
and the DIST authors' code and README. configs/fashion_mnist/teacher.yaml and
configs/fashion_mnist_pairs/teacher.yaml are hand-written and are the bases of their student recipes.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent


def _load_provenance():
    """configs/provenance.py (the official file each recipe follows and its deviations), by path: this script
    also runs loaded from its path by the tests."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("recipe_provenance", ROOT / "provenance.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


provenance = _load_provenance()
deviations = provenance.deviations
METHODS = ("kd", "dkd", "dhkd", "ikl_kd")


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


def _paper(kd, dkd, dhkd, ikl):
    return {"kd": kd, "dkd": dkd, "dhkd": dhkd, "ikl_kd": ikl}


_ALPHA_01 = "alpha 0.1 for the res56/res110 pairs (App. F)"
CIFAR_PAIRS = [
    # DHKD Table 1 (same architecture) and Table 2 (different architectures); IKL-KD: DKL Table 5.
    Pair("resnet56", "resnet20", _paper(70.66, 71.97, 71.19, 71.44), 2, 0.1, (4, 1), alpha_note=_ALPHA_01),
    Pair("resnet110", "resnet32", _paper(73.08, 74.11, 73.92, 74.26), 2, 0.1, (12, 1), alpha_note=_ALPHA_01),
    Pair("resnet32x4", "resnet8x4", _paper(73.33, 76.32, 76.54, 76.59), 8, 2, (8, 1),
         alpha_note="alpha 2, the best value of the sensitivity study (App. J, Table 11)"),
    Pair("wrn_40_2", "wrn_16_2", _paper(74.92, 76.24, 76.36, 76.45), 6, 1, (12, 3)),
    Pair("wrn_40_2", "wrn_40_1", _paper(73.54, 74.81, 75.25, 74.98), 6, 1, (8, 1)),
    Pair("vgg13", "vgg8", _paper(72.98, 74.68, 74.84, 74.98), 6, 1, (12, 1)),
    Pair("resnet32x4", "shufflev1", _paper(74.07, 76.45, 76.78, None), 8, 1, (8, 1), cross_arch=True),
    Pair("wrn_40_2", "shufflev1", _paper(74.83, 76.70, 77.25, None), 8, 1, (4, 1), cross_arch=True),
    Pair("vgg13", "mobilenetv2", _paper(67.37, 69.71, 70.09, None), 6, 1, (12, 4), cross_arch=True),
    Pair("resnet50_cifar", "mobilenetv2", _paper(67.35, 70.35, 71.08, None), 8, 1, (12, 1), cross_arch=True),
    Pair("resnet32x4", "shufflev2", _paper(74.45, 77.07, 77.99, None), 8, 1, (12, 3), cross_arch=True,
         alpha_note="alpha 1, as in the official README's example command for this pair"),
]
CIFAR_TEACHERS = {"resnet56": 72.34, "resnet110": 74.31, "resnet32x4": 79.42, "wrn_40_2": 75.61,
                  "vgg13": 74.64, "resnet50_cifar": 79.34}  # DHKD Tables 1-2, teacher rows

IMAGENET_PAIRS = [
    # DHKD Tables 3-4 (KD, DKD, DHKD) and DKL Table 3 (IKL-KD).
    Pair("resnet34", "resnet18", _paper(70.66, 71.70, 72.15, 71.91), 0.5, 0.1, (0.5, 1)),
    Pair("resnet50", "mobilenetv1", _paper(68.58, 72.05, 72.99, 72.84), 2, 0.1, (1, 4), cross_arch=True),
]
IMAGENET_TEACHERS = {"resnet34": 73.31, "resnet50": 76.16}  # torchvision weights in the papers

PAPER_NAMES = {"kd": "KD", "dkd": "DKD", "dhkd": "DHKD", "ikl_kd": "IKL-KD"}

# The feature and relation baselines of the same tables (issue 23), recipes named by the row they
# reproduce: method -> {teacher_student stem: published top-1 (%)}, with the source of the numbers.
_TABLES_1_2 = "DHKD paper, Tables 1-2"
BASELINES_CIFAR = {
    "fitnet": ({"resnet56_resnet20": "69.21", "resnet110_resnet32": "71.06", "resnet32x4_resnet8x4": "73.50",
                "wrn_40_2_wrn_16_2": "73.58", "wrn_40_2_wrn_40_1": "72.24", "vgg13_vgg8": "71.02",
                "resnet32x4_shufflev1": "73.59", "wrn_40_2_shufflev1": "73.73", "vgg13_mobilenetv2": "64.14",
                "resnet50_cifar_mobilenetv2": "63.16", "resnet32x4_shufflev2": "73.54"}, _TABLES_1_2),
    "ofd": ({"resnet56_resnet20": "70.98", "resnet110_resnet32": "73.23", "resnet32x4_resnet8x4": "74.95",
             "wrn_40_2_wrn_16_2": "75.24", "wrn_40_2_wrn_40_1": "74.33", "vgg13_vgg8": "73.95",
             "resnet32x4_shufflev1": "75.98", "wrn_40_2_shufflev1": "75.85", "vgg13_mobilenetv2": "69.48",
             "resnet50_cifar_mobilenetv2": "69.04", "resnet32x4_shufflev2": "76.82"}, _TABLES_1_2),
    # AT is in the papers' ImageNet tables only; mdistiller's one CIFAR-100 AT config (its at.yaml) is
    # for this pair.
    "at": ({"resnet32x4_resnet8x4": None}, "no CIFAR-100 number in the DHKD or DKL tables"),
    # DIST: the official README's CIFAR-100 table (hunto/DIST_KD), mean ± std of its runs; DIST is in
    # neither paper's CIFAR tables.
    "dist": ({"resnet56_resnet20": "71.75 ± 0.30", "resnet32x4_resnet8x4": "76.31 ± 0.19",
              "wrn_40_2_wrn_40_1": "74.43 ± 0.24", "resnet50_cifar_mobilenetv2": "68.66 ± 0.23",
              "resnet32x4_shufflev1": "76.34 ± 0.18", "resnet32x4_shufflev2": "77.35 ± 0.25"},
             "the DIST authors' README, hunto/DIST_KD"),
}
BASELINES_IMAGENET = {  # DHKD Tables 3-4; the DKL paper's Table 3 has the same AT and OFD numbers
    "at": ({"resnet34_resnet18": "70.69", "resnet50_mobilenetv1": "69.56"}, "DHKD paper, DKL paper Table 3"),
    "ofd": ({"resnet34_resnet18": "70.81", "resnet50_mobilenetv1": "71.25"}, "DHKD paper, DKL paper Table 3"),
    "dist": ({"resnet34_resnet18": "72.07", "resnet50_mobilenetv1": "73.24"}, "DHKD paper"),
}
BASELINE_NAMES = {"dist": "DIST", "fitnet": "FitNet", "ofd": "OFD", "at": "AT"}
# mdistiller's feature lists, as feature_info stages: "feats[1:]" (every stage after the stem) of the CIFAR
# models (3 for the ResNets, WRNs and ShuffleNets, 4 for VGG, MobileNetV2 and ResNet50) and of the
# ImageNet ResNets; its MobileNetV1 lists start at our stage 2 (the 128-channel map), and its ImageNet
# ResNets have OFD margins for layer2-layer4 only.
FIVE_STAGES = ("vgg13", "vgg8", "mobilenetv2", "resnet50_cifar")
IMAGENET_STAGES = {  # method -> stem -> (student stages, teacher stages)
    "at": {"resnet34_resnet18": ([1, 2, 3, 4], [1, 2, 3, 4]), "resnet50_mobilenetv1": ([3, 4, 5], [1, 2, 3])},
    "ofd": {"resnet34_resnet18": ([2, 3, 4], [2, 3, 4]), "resnet50_mobilenetv1": ([3, 4, 5], [2, 3, 4])},
}


def after_stem(model: str) -> list[int]:
    return [1, 2, 3, 4] if model in FIVE_STAGES else [1, 2, 3]


# ------------------------------------------------------------------------------------- CIFAR-100
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


def cifar_method(method: str, pair: Pair) -> dict:
    if method == "kd":
        return {"name": "kd", "temperature": 4.0, "ce_weight": 0.1, "kd_weight": 0.9}
    if method == "dkd":
        return {"name": "dkd", "alpha": 1.0, "beta": float(pair.dkd_beta), "temperature": 4.0, "ce_weight": 1.0,
                "warmup_epochs": 20}
    if method == "dhkd":
        return {"name": "dhkd", "alpha": float(pair.dhkd_alpha), "temperature": 2.0, "ce_weight": 1.0,
                "aux_head": "mlp" if pair.cross_arch else "linear", "alignment": "global"}
    mse, soft_ce = pair.ikl
    return {"name": "ikl_kd", "mse_weight": float(mse), "soft_ce_weight": float(soft_ce), "temperature": 4.0,
            "weight_temperature": 100.0, "ce_weight": 1.0, "warmup_epochs": 20}


def cifar_recipes() -> dict[Path, str]:
    out = {}
    for name, acc in CIFAR_TEACHERS.items():
        body = cifar_common(name, f"runs/cifar100/teacher_{name}", 0.05)
        body["method"] = {"name": "vanilla"}
        header = [f"CIFAR-100 teacher {name}: {acc:.2f} % top-1 in the DHKD paper (Tables 1-2).",
                  f"kdcollapse train --config configs/cifar100/teachers/{name}.yaml",
                  "Or start from the community's trained teacher (mdistiller/CRD cifar_teachers, docs/distillation.md):",
                  f"kdcollapse models convert --from mdistiller --model {name} CKPT.pth "
                  f"runs/cifar100/teacher_{name}/model.safetensors"]
        out[Path("cifar100/teachers") / f"{name}.yaml"] = render(header, order(body))
    for pair in CIFAR_PAIRS:
        lr = 0.01 if pair.student in ("shufflev1", "shufflev2", "mobilenetv2") else 0.05
        for method in METHODS:
            stem = f"{pair.teacher}_{pair.student}"
            body = cifar_common(pair.student, f"runs/cifar100/{method}/{stem}", lr)
            body["method"] = cifar_method(method, pair)
            body["teacher"] = {"checkpoint": f"runs/cifar100/teacher_{pair.teacher}"}
            header = [reproduces("CIFAR-100", method, pair), *notes(method, pair, "cifar100"),
                      f"kdcollapse distill --config configs/cifar100/{method}/{stem}.yaml --seeds 0,1,2"]
            out[Path("cifar100") / method / f"{stem}.yaml"] = render(header, order(body))
    for method, (numbers, source) in BASELINES_CIFAR.items():
        for pair in CIFAR_PAIRS:
            stem = f"{pair.teacher}_{pair.student}"
            if stem not in numbers:
                continue
            lr = 0.01 if pair.student in ("shufflev1", "shufflev2", "mobilenetv2") else 0.05
            body = cifar_common(pair.student, f"runs/cifar100/{method}/{stem}", lr)
            body["method"] = baseline_method(method, "cifar100", pair)
            body["teacher"] = {"checkpoint": f"runs/cifar100/teacher_{pair.teacher}"}
            header = [baseline_reproduces("CIFAR-100", method, pair, numbers[stem], source),
                      *baseline_notes(method, "cifar100"),
                      f"kdcollapse distill --config configs/cifar100/{method}/{stem}.yaml --seeds 0,1,2"]
            out[Path("cifar100") / method / f"{stem}.yaml"] = render(header, order(body))
    return out


def baseline_method(method: str, dataset: str, pair: Pair | None = None) -> dict:
    """The official hyperparameters of a baseline method on ``dataset`` (cifar100, imagenet or, for the
    fashion_mnist recipes, None: the CIFAR-100 weights and default stages)."""
    if method == "dist":  # dist_cifar.yaml (kd: dist_t4) and resnet_dist.yaml (kd: dist, tau 1)
        return {"name": "dist", "beta": 1.0, "gamma": 1.0, "temperature": 1.0 if dataset == "imagenet" else 4.0,
                "ce_weight": 1.0, "kd_weight": 2.0}
    if method == "fitnet":  # CFG.FITNET: HINT_LAYER 2, FEAT_WEIGHT 100
        return {"name": "fitnet", "ce_weight": 1.0, "hint_weight": 100.0, "student_stage": 2, "teacher_stage": 2}
    weight = {"at": 1000.0, "ofd": 1e-4 if dataset == "imagenet" else 1e-3}[method]  # CFG.AT, CFG.OFD, r50_mv1/ofd
    body = {"name": method, "ce_weight": 1.0, "feat_weight": weight}
    if pair is not None:
        stem = f"{pair.teacher}_{pair.student}"
        student, teacher = (IMAGENET_STAGES[method][stem] if dataset == "imagenet"
                            else (after_stem(pair.student), after_stem(pair.teacher)))
        body |= {"student_stages": student, "teacher_stages": teacher}
    return body


def baseline_reproduces(dataset: str, method: str, pair: Pair, number: str | None, source: str) -> str:
    what = f"Reproduces: {BASELINE_NAMES[method]} {pair.teacher} -> {pair.student} on {dataset}"
    return f"{what}: {source}." if number is None else f"{what}: {number} % top-1 ({source})."


def baseline_notes(method: str, dataset: str) -> list[str]:
    if method == "dist":
        if dataset == "cifar100":
            return ["Official DIST config dist_cifar.yaml: tau 4, CE weight 1, DIST weight 2, beta = gamma = 1, "
                    "lr x0.1 at epochs 150, 180, 210 (as here)."]
        return ["Official DIST config resnet_dist.yaml: tau 1, CE weight 1, DIST weight 2, beta = gamma = 1, "
                "lr x0.1 every 30 epochs (as here)."]
    if method == "fitnet":
        return ["mdistiller's FitNet config: hint = teacher stage 2, guided = student stage 2, ConvReg regressor, "
                "CE 1 + MSE 100, trained jointly from epoch 1."]
    if method == "at":
        return ["mdistiller's AT config: p 2, beta 1000, CE 1, the stages after the stem (feats[1:])."]
    if method == "ofd":
        return [f"mdistiller's OFD config: pre-ReLU stage maps (preact_feats[1:]), 1x1 conv + BN connectors, "
                f"margins from the teacher's BN statistics, CE 1 + OFD {1e-4 if dataset == 'imagenet' else 1e-3:g}."]
    return []


def reproduces(dataset: str, method: str, pair: Pair) -> str:
    number = pair.paper[method]
    source = "DKL paper" if method == "ikl_kd" else "DHKD paper"
    what = f"{PAPER_NAMES[method]} {pair.teacher} -> {pair.student} on {dataset}"
    if number is None:
        return (f"Reproduces: {what}; the DKL paper reports it in its appendix Table 6, which the copy in "
                "shared/papers lacks.")
    return f"Reproduces: {what}: {number:.2f} % top-1 ({source})."


def notes(method: str, pair: Pair, dataset: str) -> list[str]:
    if method == "dhkd":
        if dataset == "imagenet":
            return ["DHKD ImageNet recipe (App. F): alpha 0.1, linear auxiliary head, no gradient alignment, "
                    "BinaryKL-Norm for the first 50 of 100 epochs."]
        return [f"DHKD CIFAR recipe (App. F): tau 2, gradient alignment, {pair.alpha_note}."]
    if method == "dkd":
        return [f"mdistiller's DKD config for this pair: beta {pair.dkd_beta:g}."]
    if method == "ikl_kd":
        mse, soft_ce = pair.ikl
        return [f"Official IKL-KD config: BETA {mse:g} (wMSE) -> mse_weight, ALPHA {soft_ce:g} (soft CE) "
                "-> soft_ce_weight."]
    return []


# -------------------------------------------------------------------------------------- ImageNet
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


def imagenet_method(method: str, pair: Pair) -> dict:
    if method == "kd":  # mdistiller ImageNet KD config
        return {"name": "kd", "temperature": 1.0, "ce_weight": 0.5, "kd_weight": 0.5}
    if method == "dkd":  # mdistiller ImageNet DKD configs
        return {"name": "dkd", "alpha": 1.0, "beta": float(pair.dkd_beta), "temperature": 1.0, "ce_weight": 1.0,
                "warmup_epochs": 1}
    if method == "dhkd":
        return {"name": "dhkd", "alpha": 0.1, "temperature": 2.0, "ce_weight": 1.0, "aux_head": "linear",
                "alignment": "off", "distill_until": 50}
    mse, soft_ce = pair.ikl  # global information on, T2 = 1; tau 1 and a 1-epoch ramp are the code's defaults
    return {"name": "ikl_kd", "mse_weight": float(mse), "soft_ce_weight": float(soft_ce), "temperature": 1.0,
            "weight_temperature": 1.0, "ce_weight": 1.0, "warmup_epochs": 1}


def imagenet_recipes() -> dict[Path, str]:
    out = {}
    for name, acc in IMAGENET_TEACHERS.items():
        body = imagenet_common(name, f"runs/imagenet/teacher_{name}")
        body["method"] = {"name": "vanilla"}
        header = [f"ImageNet teacher {name}: {acc:.2f} % top-1 (the torchvision weights the papers use).",
                  f"torchrun --nproc_per_node=8 -m kdcollapse train --config configs/imagenet/teachers/{name}.yaml "
                  f"data.batch_size={per_gpu(body)}"]
        out[Path("imagenet/teachers") / f"{name}.yaml"] = render(header, order(body))
    for pair in IMAGENET_PAIRS:
        for method in METHODS:
            stem = f"{pair.teacher}_{pair.student}"
            body = imagenet_common(pair.student, f"runs/imagenet/{method}/{stem}", method)
            body["method"] = imagenet_method(method, pair)
            body["teacher"] = {"checkpoint": f"runs/imagenet/teacher_{pair.teacher}"}
            header = [reproduces("ImageNet", method, pair), *notes(method, pair, "imagenet"),
                      f"torchrun --nproc_per_node=8 -m kdcollapse distill --config configs/imagenet/{method}/"
                      f"{stem}.yaml data.batch_size={per_gpu(body)}"]
            out[Path("imagenet") / method / f"{stem}.yaml"] = render(header, order(body))
    for method, (numbers, source) in BASELINES_IMAGENET.items():
        for pair in IMAGENET_PAIRS:
            stem = f"{pair.teacher}_{pair.student}"
            body = imagenet_common(pair.student, f"runs/imagenet/{method}/{stem}", method)
            body["method"] = baseline_method(method, "imagenet", pair)
            body["teacher"] = {"checkpoint": f"runs/imagenet/teacher_{pair.teacher}"}
            header = [baseline_reproduces("ImageNet", method, pair, numbers[stem], source),
                      *baseline_notes(method, "imagenet"),
                      f"torchrun --nproc_per_node=8 -m kdcollapse distill --config configs/imagenet/{method}/"
                      f"{stem}.yaml data.batch_size={per_gpu(body)}"]
            out[Path("imagenet") / method / f"{stem}.yaml"] = render(header, order(body))
    return out


# --------------------------------------------------------------------------------- Fashion-MNIST
FMNIST_METHODS = {
    # file stem: (method section, header line)
    "student": ({"name": "vanilla"}, "convnet_small trained alone (cross-entropy only): the baseline."),
    "kd": ({"name": "kd", "temperature": 4.0, "ce_weight": 0.1, "kd_weight": 0.9}, "KD, mdistiller's weights."),
    "dkd": ({"name": "dkd", "alpha": 1.0, "beta": 8.0, "temperature": 4.0, "ce_weight": 1.0, "warmup_epochs": 2},
            "DKD, mdistiller's weights; the 20-of-240-epoch ramp shortened to 2 of 15."),
    "dhkd": ({"name": "dhkd", "alpha": 1.0, "temperature": 2.0, "ce_weight": 1.0, "aux_head": "linear",
              "alignment": "global"}, "DHKD with the CIFAR recipe's gradient alignment."),
    "ikl_kd": ({"name": "ikl_kd", "mse_weight": 8.0, "soft_ce_weight": 1.0, "temperature": 4.0,
                "weight_temperature": 1.0, "ce_weight": 1.0, "warmup_epochs": 2},
               "IKL-KD with class-wise weights (T2 = 1) and resnet32x4 -> resnet8x4's weights."),
    "dual_head_kd": ({"name": "dual_head_kd", "kd_weight": 1.0, "temperature": 4.0, "ce_weight": 1.0,
                      "aux_head": "linear"}, "Dual head with KD on the auxiliary head (DHKD App. K)."),
    "ce_binarykl": ({"name": "ce_binarykl", "alpha": 1.0, "temperature": 2.0, "ce_weight": 1.0},
                    "CE + BinaryKL on one head: the combination DHKD §3.1 shows collapsing."),
    "binarykl_only": ({"name": "ce_binarykl", "alpha": 1.0, "temperature": 2.0, "ce_weight": 0.0},
                      "BinaryKL alone (no labels), the second setting of DHKD §3.1."),
    "dist": (baseline_method("dist", "cifar100"), "DIST, the official CIFAR-100 weights (tau 4)."),
    "pkt": ({"name": "pkt", "ce_weight": 1.0, "pkt_weight": 30000.0}, "PKT on penultimate features, mdistiller's weights."),
    "fitnet": (baseline_method("fitnet", None), "FitNet, hint and guided layer at stage 2, mdistiller's weights."),
    "at": (baseline_method("at", None), "AT on the three stages after the stem, mdistiller's weights."),
    "ofd": (baseline_method("ofd", None), "OFD on the three stages after the stem, mdistiller's CIFAR weights."),
    "nst": ({"name": "nst", "ce_weight": 1.0, "feat_weight": 50.0}, "NST on the three stages after the stem, "
            "mdistiller's weights."),
    "sp": ({"name": "sp", "ce_weight": 1.0, "feat_weight": 3000.0}, "SP on the last stage, mdistiller's weights."),
}


BASELINE_STEMS = ("dist", "pkt", "fitnet", "at", "ofd", "nst", "sp", "crd", "reviewkd", "vid")  # issue 23's methods


def fmnist_recipes(area: str = "fashion_mnist", prefix: str = "fmnist", stems=tuple(FMNIST_METHODS),
                   title: str = "Fashion-MNIST", results: str = "results/distillation/.") -> dict[Path, str]:
    base = yaml.safe_load((ROOT / area / "teacher.yaml").read_text())
    out = {}
    for stem in stems:
        method, line = (FMNIST_METHODS | FMNIST_FEATURE_METHODS)[stem]
        body = {**base, "run_dir": f"runs/{prefix}_{stem}", "model": {"name": "convnet_small"}, "method": method}
        if method["name"] != "vanilla":
            body["teacher"] = {"checkpoint": f"runs/{prefix}_teacher"}
        command = "train" if method["name"] == "vanilla" else "distill"
        found = results if stem not in BASELINE_STEMS else "not run yet (issue 23)" if area == "fashion_mnist" \
            else "results/distillation/method_table_k100 (issue 24)"
        header = [f"{title}, convnet -> convnet_small: {line}",
                  f"Schedule and augmentation as configs/{area}/teacher.yaml; results: {found}",
                  f"kdcollapse {command} --config configs/{area}/{stem}.yaml --seeds 0,1,2"]
        out[Path(area) / f"{stem}.yaml"] = render(header, order(body))
    return out


# The 100-class task (docs/data.md); configs/fashion_mnist_pairs/teacher.yaml is hand-written, as above.
PAIRS_STEMS = ("student", "kd", "dkd", "dhkd", "ikl_kd", "dual_head_kd", "ce_binarykl", "binarykl_only",
               # the feature methods of the K = 10 method table, with the same weights (issue 24)
               "fitnet", "at", "ofd", "dist", "nst", "sp", "pkt", "crd", "reviewkd", "vid")


def pairs_recipes() -> dict[Path, str]:
    return fmnist_recipes("fashion_mnist_pairs", "fmnist_pairs", PAIRS_STEMS, "Fashion-MNIST pairs (100 classes)",
                          "none yet (issue 13).")


# ---------------------------------------------------------------- the 2026 logit methods (issue 24)
# (method file stem, paper, method section); "_ls": with logit standardization at the authors' base
# temperature 2 and KD weight 9 (sunshangquan/logit-standardization-KD, tools/train.py --logit-stand).
CTKD_SOURCE = "CTKD README (zhengli97/CTKD), KD+CTKD row"
WTTM_SOURCE = "WTTM README (zkxufo/TTM), WTTM row"
LOGIT_CIFAR = {
    "ctkd": (CTKD_SOURCE, {"name": "ctkd", "ce_weight": 0.1, "kd_weight": 0.9, "t_start": 1.0, "t_end": 20.0,
                           "lambda_max": 1.0, "curriculum_epochs": 10},
             {("resnet56", "resnet20"): 71.19, ("resnet110", "resnet32"): 73.52, ("resnet110", "resnet20"): 70.99,
              ("wrn_40_2", "wrn_16_2"): 75.45, ("wrn_40_2", "wrn_40_1"): 73.93, ("vgg13", "vgg8"): 73.52}),
    "wttm": (WTTM_SOURCE, {"name": "wttm", "gamma": 0.2, "ce_weight": 1.0, "wttm_weight": 4.0},
             {("wrn_40_2", "wrn_16_2"): 76.37, ("wrn_40_2", "wrn_40_1"): 74.58, ("resnet56", "resnet20"): 71.92,
              ("resnet110", "resnet20"): 71.67, ("resnet110", "resnet32"): 74.13,
              ("resnet32x4", "resnet8x4"): 76.06, ("vgg13", "vgg8"): 74.44}),
    "mlkd": ("MLKD paper, as quoted in issue 24", {"name": "mlkd", "temperature": 4.0, "ce_weight": 0.1,
                                                   "kd_weight": 0.9},
             {("resnet32x4", "resnet8x4"): 77.08}),
    "kd_ls": ("logit-standardization paper, as quoted in issue 24",
              {"name": "kd", "temperature": 2.0, "ce_weight": 0.1, "kd_weight": 9.0, "logit_standardization": True},
              {("resnet32x4", "resnet8x4"): 76.62}),
    "dkd_ls": ("logit-standardization paper, as quoted in issue 24",
               {"name": "dkd", "alpha": 9.0, "beta": 72.0, "temperature": 2.0, "ce_weight": 1.0, "warmup_epochs": 20,
                "logit_standardization": True}, {("resnet32x4", "resnet8x4"): 77.01}),
    "mlkd_ls": ("logit-standardization paper, as quoted in issue 24",
                {"name": "mlkd", "temperature": 2.0, "ce_weight": 0.1, "kd_weight": 9.0, "logit_standardization": True},
                {("resnet32x4", "resnet8x4"): 78.28}),
}
LOGIT_NOTES = {
    "ctkd": "Official run_cifar_distill.sh: -r 0.1 -a 0.9, global temperature 1 + 20*sigmoid, cosine lambda 0 -> 1 "
            "over 10 epochs, batch 64, lr 0.05.",
    "wttm": "WTTM on the TTM code's CRD-style solver (batch 64, lr 0.05, 240 epochs, CE 1).",
    "mlkd": "Official CIFAR-100 configs (Multi-Level-Logit-Distillation, ours): T 4 (and 3, 5, 2, 6), CE 0.1, "
            "KD 0.9, batch 64, lr 0.025; weak + strong (RandAugment(2) + Cutout) views.",
    "kd_ls": "--logit-stand --base-temp 2 --kd-weight 9 on mdistiller's KD config.",
    "dkd_ls": "--logit-stand --base-temp 2 --kd-weight 9: DKD alpha and beta (1, 8) times 9.",
    "mlkd_ls": "--logit-stand --base-temp 2 --kd-weight 9 on MLKD's config.",
}
LOGIT_IMAGENET = {
    "ctkd": (CTKD_SOURCE, {"name": "ctkd", "ce_weight": 1.0, "kd_weight": 1.0, "t_start": 1.0, "t_end": 20.0,
                           "lambda_max": 1.0, "curriculum_epochs": 5}, {("resnet34", "resnet18"): 71.32},
             "Official run_imagenet_distill.sh: -r 1 -a 1, 120 epochs (lr steps 30, 60, 90), curriculum 5 epochs."),
    "nkd": ("cls_KD nkd.md (yzd-v/cls_KD)", {"name": "nkd", "temperature": 1.0, "gamma": 1.5, "ce_weight": 1.0,
                                            "nkd_weight": 1.0},
            {("resnet34", "resnet18"): 71.96, ("resnet50", "mobilenetv1"): 72.58},
            "Official res34_distill_res18_img.py: temp 1, gamma 1.5, on mmcls' ResNet-18 schedule (100 epochs)."),
    "wttm": (WTTM_SOURCE, {"name": "wttm", "gamma": 0.2, "ce_weight": 1.0, "wttm_weight": 4.0},
             {("resnet34", "resnet18"): 72.19, ("resnet50", "mobilenetv1"): 73.09},
             "The authors ran ImageNet with torchdistill; gamma and weight here are the README's CRD + WTTM example."),
    "mlkd": ("MLKD official ImageNet config (r34_r18, kd_ours)", {"name": "mlkd", "temperature": 1.0,
                                                                    "ce_weight": 0.5, "kd_weight": 0.5},
             {("resnet34", "resnet18"): None},
             "Official config: T 1, CE 0.5, KD 0.5, batch 512, lr 0.1, 100 epochs; the paper's number is not in "
             "our copies."),
}
FMNIST_LOGIT = {
    "nkd": {"name": "nkd", "temperature": 1.0, "gamma": 1.5, "ce_weight": 1.0, "nkd_weight": 1.0},
    "wttm": {"name": "wttm", "gamma": 0.2, "ce_weight": 1.0, "wttm_weight": 4.0},
    "ctkd": {"name": "ctkd", "ce_weight": 0.1, "kd_weight": 0.9, "t_start": 1.0, "t_end": 20.0, "lambda_max": 1.0,
             "curriculum_epochs": 2},
    "mlkd": {"name": "mlkd", "temperature": 4.0, "ce_weight": 0.1, "kd_weight": 0.9},
    "kd_ls": {"name": "kd", "temperature": 2.0, "ce_weight": 0.1, "kd_weight": 9.0, "logit_standardization": True},
    "dkd_ls": {"name": "dkd", "alpha": 9.0, "beta": 72.0, "temperature": 2.0, "ce_weight": 1.0, "warmup_epochs": 2,
               "logit_standardization": True},
    "ctkd_ls": {"name": "ctkd", "ce_weight": 0.1, "kd_weight": 9.0, "t_start": 1.0, "t_end": 20.0, "lambda_max": 1.0,
                "curriculum_epochs": 2, "logit_standardization": True},
    "mlkd_ls": {"name": "mlkd", "temperature": 2.0, "ce_weight": 0.1, "kd_weight": 0.9, "logit_standardization": True},
}


MLKD_FMNIST_NOTE = ("Batch 64 and lr 0.025 as MLKD's official solver: the class-correlation term grows as B^2/K; at "
                    "batch 128 MLKD + LS collapsed in one epoch here (class term 25,125, 10 % training accuracy).")
MLKD_LS_FMNIST_NOTE = ("kd_weight 0.9 (MLKD's), not the LS authors' 9: with 9, which also multiplies the correlation "
                       "terms, one epoch ended at 11 % training accuracy here at batch 64 and 128; 0.9 gave 42.6 %.")


def logit_recipes() -> dict[Path, str]:
    out = {}
    for stem, (source, method, rows) in LOGIT_CIFAR.items():
        for (teacher, student), number in rows.items():
            lr = 0.025 if method["name"] == "mlkd" else 0.05
            body = cifar_common(student, f"runs/cifar100/{stem}/{teacher}_{student}", lr)
            if stem == "mlkd_ls":  # the logit-standardization repository's MLKD config trains 480 epochs
                body["train"] = {"epochs": 480}
            body["method"], body["teacher"] = dict(method), {"checkpoint": f"runs/cifar100/teacher_{teacher}"}
            header = [f"Reproduces: {stem} {teacher} -> {student} on CIFAR-100: {number:.2f} % top-1 ({source}).",
                      LOGIT_NOTES[stem],
                      f"kdcollapse distill --config configs/cifar100/{stem}/{teacher}_{student}.yaml --seeds 0,1,2"]
            out[Path("cifar100") / stem / f"{teacher}_{student}.yaml"] = render(header, order(body))
    for stem, (source, method, rows, note) in LOGIT_IMAGENET.items():
        for (teacher, student), number in rows.items():
            body = imagenet_common(student, f"runs/imagenet/{stem}/{teacher}_{student}", stem)
            if stem == "ctkd":
                body["train"], body["schedule"]["milestones"] = {"epochs": 120}, [30, 60, 90]
            body["method"], body["teacher"] = dict(method), {"checkpoint": f"runs/imagenet/teacher_{teacher}"}
            result = f"{number:.2f} % top-1 ({source})" if number is not None else f"no number ({source})"
            header = [f"Reproduces: {stem} {teacher} -> {student} on ImageNet: {result}.", note,
                      f"torchrun --nproc_per_node=8 -m kdcollapse distill --config configs/imagenet/{stem}/"
                      f"{teacher}_{student}.yaml data.batch_size={per_gpu(body)}"]
            out[Path("imagenet") / stem / f"{teacher}_{student}.yaml"] = render(header, order(body))
    for area, prefix, title in (("fashion_mnist", "fmnist", "Fashion-MNIST"),
                                ("fashion_mnist_pairs", "fmnist_pairs", "Fashion-MNIST pairs (100 classes)")):
        base = yaml.safe_load((ROOT / area / "teacher.yaml").read_text())
        for stem, method in FMNIST_LOGIT.items():
            body = {**base, "run_dir": f"runs/{prefix}_{stem}", "model": {"name": "convnet_small"},
                    "method": dict(method), "teacher": {"checkpoint": f"runs/{prefix}_teacher"}}
            extra = []
            if method["name"] == "mlkd":  # the official MLKD solver: batch 64, lr 0.025
                body["data"] = {**base["data"], "batch_size": 64}
                body["optim"] = {**base["optim"], "lr": 0.025}
                extra = [MLKD_FMNIST_NOTE] + ([MLKD_LS_FMNIST_NOTE] if stem == "mlkd_ls" else [])
            header = [f"{title}, convnet -> convnet_small: {stem} with its papers' weights (curricula and ramps "
                      "shortened to 2 of 15 epochs).", *extra,
                      f"Schedule and augmentation as configs/{area}/teacher.yaml; results: none yet (issue 24).",
                      f"kdcollapse distill --config configs/{area}/{stem}.yaml --seeds 0,1,2"]
            out[Path(area) / f"{stem}.yaml"] = render(header, order(body))
    return out


# ---------------------------------------------------------------- feature methods (issue 23): CRD, ReviewKD, VID
# Published top-1 (%): CRD and ReviewKD from DHKD Tables 1-4 (the DKL paper's Tables 3 and 5 give the same
# numbers); VID from the intra-class paper's Table 1. Keyed by (teacher, student).
FEATURE_PAPER = {
    "crd": {("resnet56", "resnet20"): 71.16, ("resnet110", "resnet32"): 73.48, ("resnet32x4", "resnet8x4"): 75.51,
            ("wrn_40_2", "wrn_16_2"): 75.48, ("wrn_40_2", "wrn_40_1"): 74.14, ("vgg13", "vgg8"): 73.94,
            ("resnet32x4", "shufflev1"): 75.11, ("wrn_40_2", "shufflev1"): 76.05, ("vgg13", "mobilenetv2"): 69.73,
            ("resnet50_cifar", "mobilenetv2"): 69.11, ("resnet32x4", "shufflev2"): 75.65,
            ("resnet34", "resnet18"): 71.17, ("resnet50", "mobilenetv1"): 71.37},
    "reviewkd": {("resnet56", "resnet20"): 71.89, ("resnet110", "resnet32"): 73.89,
                 ("resnet32x4", "resnet8x4"): 75.63, ("wrn_40_2", "wrn_16_2"): 76.12,
                 ("wrn_40_2", "wrn_40_1"): 75.09, ("vgg13", "vgg8"): 74.84, ("resnet32x4", "shufflev1"): 77.45,
                 ("wrn_40_2", "shufflev1"): 77.14, ("vgg13", "mobilenetv2"): 70.37,
                 ("resnet50_cifar", "mobilenetv2"): 69.89, ("resnet32x4", "shufflev2"): 77.78,
                 ("resnet34", "resnet18"): 71.61, ("resnet50", "mobilenetv1"): 72.56},
    "vid": {("resnet32x4", "resnet8x4"): None},  # mdistiller's VID config; VID is in no DHKD/DKL table
}
FEATURE_NAMES = {"crd": "CRD", "reviewkd": "ReviewKD", "vid": "VID"}
# ReviewKD's loss weight per pair: the official CIFAR script (dvlab-research/ReviewKD CIFAR-100/script/reviewKD.sh,
# mdistiller agrees for resnet32x4 -> resnet8x4); pairs it does not list keep the code's default 1.0.
REVIEWKD_WEIGHT = {("wrn_40_2", "wrn_16_2"): 5.0, ("wrn_40_2", "wrn_40_1"): 5.0, ("wrn_40_2", "shufflev1"): 5.0,
                   ("resnet32x4", "resnet8x4"): 5.0, ("resnet32x4", "shufflev1"): 5.0,
                   ("resnet32x4", "shufflev2"): 8.0, ("resnet56", "resnet20"): 0.6, ("resnet110", "resnet32"): 1.0}


def stage_keys(pair: Pair) -> dict:
    """ReviewKD's and VID's stages: mdistiller's feats[1:] (see after_stem), MobileNetV1's from our stage 2."""
    def of(model: str) -> list[int]:
        imagenet = {"resnet18": [1, 2, 3, 4], "resnet34": [1, 2, 3, 4], "resnet50": [1, 2, 3, 4],
                    "mobilenetv1": [2, 3, 4, 5]}
        return imagenet.get(model) or after_stem(model)

    return {"student_stages": of(pair.student), "teacher_stages": of(pair.teacher)}


def feature_method(method: str, pair: Pair, dataset: str) -> dict:
    imagenet = dataset == "imagenet"
    if method == "crd":  # mdistiller CRD defaults; its ImageNet sampler draws negatives with replacement
        return {"name": "crd", "ce_weight": 1.0, "crd_weight": 0.8, "feat_dim": 128, "num_negatives": 16384,
                "temperature": 0.07, "momentum": 0.5, "replacement": imagenet}
    if method == "reviewkd":
        if imagenet:  # mdistiller ImageNet configs; mid channels 256 for MobileNet as the official ImageNet code
            weight, mid = (1.0, 0) if pair.student == "resnet18" else (8.0, 256)
            return {"name": "reviewkd", "ce_weight": 1.0, "reviewkd_weight": weight, "warmup_epochs": 1,
                    "student_pre_act": True, "mid_channels": mid, **stage_keys(pair)}
        return {"name": "reviewkd", "ce_weight": 1.0,
                "reviewkd_weight": REVIEWKD_WEIGHT.get((pair.teacher, pair.student), 1.0), "warmup_epochs": 20,
                "student_pre_act": False, "mid_channels": 0, **stage_keys(pair)}
    # mdistiller keeps VID's variances in a plain list, outside its optimizer: fixed at init_variance
    return {"name": "vid", "ce_weight": 1.0, "vid_weight": 1.0, "init_variance": 5.0, "learn_variance": False,
            **stage_keys(pair)}


def feature_header(method: str, pair: Pair, dataset: str) -> str:
    number = FEATURE_PAPER[method][(pair.teacher, pair.student)]
    what = f"{FEATURE_NAMES[method]} {pair.teacher} -> {pair.student} on {dataset}"
    if number is None:
        return f"Reproduces: {what}: mdistiller's config; no published number in the DHKD or DKL tables."
    return f"Reproduces: {what}: {number:.2f} % top-1 (DHKD paper, Tables 1-4)."


def feature_recipes() -> dict[Path, str]:
    out = {}
    for area, dataset, pairs in (("cifar100", "CIFAR-100", CIFAR_PAIRS), ("imagenet", "ImageNet", IMAGENET_PAIRS)):
        for pair in pairs:
            for method, rows in FEATURE_PAPER.items():
                if (pair.teacher, pair.student) not in rows:
                    continue
                stem = f"{pair.teacher}_{pair.student}"
                run_dir = f"runs/{area}/{method}/{stem}"
                if area == "cifar100":
                    lr = 0.01 if pair.student in ("shufflev1", "shufflev2", "mobilenetv2") else 0.05
                    body = cifar_common(pair.student, run_dir, lr)
                    command = f"kdcollapse distill --config configs/{area}/{method}/{stem}.yaml --seeds 0,1,2"
                else:
                    body = imagenet_common(pair.student, run_dir, method)
                    command = (f"torchrun --nproc_per_node=8 -m kdcollapse distill --config configs/{area}/{method}/"
                               f"{stem}.yaml data.batch_size={per_gpu(body)}")
                body["method"] = feature_method(method, pair, area)
                body["teacher"] = {"checkpoint": f"runs/{area}/teacher_{pair.teacher}"}
                header = [feature_header(method, pair, dataset), *feature_notes(method, pair, area), command]
                out[Path(area) / method / f"{stem}.yaml"] = render(header, order(body))
    return out


def feature_notes(method: str, pair: Pair, area: str) -> list[str]:
    if method == "crd":
        return ["mdistiller's CRD config: CE 1, CRD 0.8, 128-d embeddings, 16384 negatives from other classes, "
                "tau 0.07, memory momentum 0.5" + ("; negatives drawn with replacement as its ImageNet sampler"
                                                    if area == "imagenet" else ".")]
    if method == "reviewkd":
        weight = feature_method(method, pair, area)["reviewkd_weight"]
        source = ("mdistiller's ImageNet config" if area == "imagenet" else
                  "the official CIFAR script" if (pair.teacher, pair.student) in REVIEWKD_WEIGHT else
                  "the official code's default: the script lists no run for this pair")
        return [f"ReviewKD loss weight {weight:g} ({source}); mdistiller's solver (batch and lr as the other "
                "recipes of this table), its warm-up min(epoch / warmup_epochs, 1) with epochs counted from 1."]
    return ["mdistiller's VID config: CE 1, VID 1, initial variance 5, the stages after the stem."]


FMNIST_FEATURE_METHODS = {
    "crd": ({"name": "crd", "ce_weight": 1.0, "crd_weight": 0.8, "feat_dim": 128, "num_negatives": 4096,
             "temperature": 0.07, "momentum": 0.5, "replacement": False},
            "CRD, mdistiller's weights; 4096 negatives instead of 16384 to fit a CPU."),
    "reviewkd": ({"name": "reviewkd", "ce_weight": 1.0, "reviewkd_weight": 1.0, "warmup_epochs": 1,
                  "student_pre_act": False, "mid_channels": 0},
                 "ReviewKD, mdistiller's defaults; the 20-of-240-epoch warm-up shortened to 1 of 15."),
    "vid": ({"name": "vid", "ce_weight": 1.0, "vid_weight": 1.0, "init_variance": 5.0}, "VID, mdistiller's weights."),
}


def fmnist_feature_recipes() -> dict[Path, str]:
    return fmnist_recipes(stems=tuple(FMNIST_FEATURE_METHODS))


# ---------------------------------------------------------------------------------------- output
_ORDER = ("run_dir", "seed", "data", "model", "teacher", "method", "optim", "schedule", "train")


def order(body: dict) -> dict:
    return {key: body[key] for key in _ORDER if key in body} | {k: v for k, v in body.items() if k not in _ORDER}


def render(header: list[str], body: dict) -> str:
    comments = "".join(f"# {line}\n" for line in header)
    return comments + "# Generated by configs/generate.py; edit the tables there, not this file.\n" + \
        yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=120)


def with_provenance(rel: Path, text: str) -> str:
    """A CIFAR-100 / ImageNet recipe with the official file it follows and its deviations after its first line."""
    if rel.parts[0] not in ("cifar100", "imagenet"):
        return text
    lines = [f"Follows: {provenance.follows(str(rel))}",
             *(f"Deviation ({key}): {why}" for key, why in deviations(str(rel)).items())]
    first, rest = text.split("\n", 1)
    return "\n".join([first, *(f"# {line}" for line in lines), rest])


# Where the teacher a student recipe names comes from, for a reader without it (issue 42): its second line.
TEACHER_SOURCES = {
    "runs/fmnist_teacher": "`kdcollapse train --config fashion_mnist/teacher` (or, in a checkout, "
                           "teacher.checkpoint=results/teachers/fashion_mnist_convnet)",
    "runs/fmnist_pairs_teacher": "`kdcollapse train --config fashion_mnist_pairs/teacher` (or, in a checkout, "
                                 "teacher.checkpoint=results/teachers/fashion_mnist_pairs_convnet)",
}


def with_teacher_source(text: str) -> str:
    """A student recipe with how to get its teacher after its first line."""
    checkpoint = yaml.safe_load(text).get("teacher", {}).get("checkpoint")
    if checkpoint in TEACHER_SOURCES:
        line = f"# Needs the teacher {checkpoint}: {TEACHER_SOURCES[checkpoint]}."
    elif checkpoint and checkpoint.startswith(("runs/cifar100/", "runs/imagenet/")):
        line = (f"# Needs the teacher {checkpoint}: a run of its own, or community weights converted there "
                "(`kdcollapse models convert`, docs/distillation.md).")
    else:
        return text
    first, rest = text.split("\n", 1)
    return "\n".join([first, line, rest])


def recipes() -> dict[Path, str]:
    """Every generated recipe: path relative to configs/ -> file text."""
    out = (cifar_recipes() | imagenet_recipes() | fmnist_recipes() | pairs_recipes() | logit_recipes()
           | feature_recipes() | fmnist_feature_recipes())
    return {rel: with_teacher_source(with_provenance(rel, text)) for rel, text in out.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    args = parser.parse_args(argv)
    stale = []
    for rel, text in recipes().items():
        path = ROOT / rel
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(rel))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print("out of date (run python configs/generate.py):", *stale, sep="\n  ")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
