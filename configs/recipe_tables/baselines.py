"""The feature and relation baselines of the same tables (issue 23): FitNet, OFD, AT and DIST on the pairs
of configs/recipe_tables/dhkd_tables.py."""

from __future__ import annotations

from pathlib import Path

from .common import Pair, after_stem, student_recipe, student_solver
from .dhkd_tables import CIFAR_PAIRS, IMAGENET_PAIRS

# Recipes named by the row they reproduce: method -> {teacher_student stem: published top-1 (%)}, with the source of the numbers.
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
# mdistiller's ImageNet stage lists (see FIVE_STAGES in common.py)
IMAGENET_STAGES = {  # method -> stem -> (student stages, teacher stages)
    "at": {"resnet34_resnet18": ([1, 2, 3, 4], [1, 2, 3, 4]), "resnet50_mobilenetv1": ([3, 4, 5], [1, 2, 3])},
    "ofd": {"resnet34_resnet18": ([2, 3, 4], [2, 3, 4]), "resnet50_mobilenetv1": ([3, 4, 5], [2, 3, 4])},
}


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


def baseline_recipes() -> dict[Path, str]:
    out = {}
    for area, dataset, pairs, table in (("cifar100", "CIFAR-100", CIFAR_PAIRS, BASELINES_CIFAR),
                                        ("imagenet", "ImageNet", IMAGENET_PAIRS, BASELINES_IMAGENET)):
        for method, (numbers, source) in table.items():
            for pair in pairs:
                stem = f"{pair.teacher}_{pair.student}"
                if stem not in numbers:
                    continue
                body = student_solver(area, pair.student, f"runs/{area}/{method}/{stem}", method)
                body["method"] = baseline_method(method, area, pair)
                header = [baseline_reproduces(dataset, method, pair, numbers[stem], source),
                          *baseline_notes(method, area)]
                out |= student_recipe(area, method, pair.teacher, pair.student, body, header)
    return out
