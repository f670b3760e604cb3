"""The Fashion-MNIST recipes (10 classes, and the 100-class pairs task): every method with its papers'
weights on convnet -> convnet_small, based on the hand-written teacher.yaml of each area."""

from __future__ import annotations

from pathlib import Path

import yaml

from .baselines import baseline_method
from .common import ROOT, order, render

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

FMNIST_FEATURE_METHODS = {
    "crd": ({"name": "crd", "ce_weight": 1.0, "crd_weight": 0.8, "feat_dim": 128, "num_negatives": 4096,
             "temperature": 0.07, "momentum": 0.5, "replacement": False},
            "CRD, mdistiller's weights; 4096 negatives instead of 16384 to fit a CPU."),
    "reviewkd": ({"name": "reviewkd", "ce_weight": 1.0, "reviewkd_weight": 1.0, "warmup_epochs": 1,
                  "student_pre_act": False, "mid_channels": 0},
                 "ReviewKD, mdistiller's defaults; the 20-of-240-epoch warm-up shortened to 1 of 15."),
    "vid": ({"name": "vid", "ce_weight": 1.0, "vid_weight": 1.0, "init_variance": 5.0}, "VID, mdistiller's weights."),
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


def fmnist_feature_recipes() -> dict[Path, str]:
    return fmnist_recipes(stems=tuple(FMNIST_FEATURE_METHODS))
