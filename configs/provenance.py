"""Which official file each CIFAR-100 / ImageNet recipe follows, and where it deliberately does not.

Read by configs/generate.py, which prints both in every recipe's header; tests/test_official_recipes.py
compares each recipe field with the official values of tests/data/official_recipes.yaml (read from the
official repositories at the commits below) and accepts a difference only where DEVIATIONS names it.
"""

from __future__ import annotations

COMMITS = {
    "megvii-research/mdistiller": "a08d46f", "jiequancui/DKL": "c5e8ad2", "penghui-yang/DHKD": "7976c69",
    "sunshangquan/logit-standardization-KD": "f6e5aa5", "Jin-Ying/Multi-Level-Logit-Distillation": "5ee473f",
    "zkxufo/TTM": "fe457b3", "zhengli97/CTKD": "7d52522",
}
# mdistiller's / DKL's per-pair file stems.
STEMS = {
    ("resnet56", "resnet20"): "res56_res20", ("resnet110", "resnet32"): "res110_res32",
    ("resnet32x4", "resnet8x4"): "res32x4_res8x4", ("wrn_40_2", "wrn_16_2"): "wrn40_2_wrn_16_2",
    ("wrn_40_2", "wrn_40_1"): "wrn40_2_wrn_40_1", ("vgg13", "vgg8"): "vgg13_vgg8",
    ("resnet32x4", "shufflev1"): "res32x4_shuv1", ("wrn_40_2", "shufflev1"): "wrn40_2_shuv1",
    ("vgg13", "mobilenetv2"): "vgg13_mv2", ("resnet50_cifar", "mobilenetv2"): "res50_mv2",
    ("resnet32x4", "shufflev2"): "res32x4_shuv2", ("resnet34", "resnet18"): "r34_r18",
    ("resnet50", "mobilenetv1"): "r50_mv1",
}
UNCHECKED = {
    "dist": "DIST's configs are in the submodule hunto/image_classification_sota, not fetched",
    "nkd": "NKD's mmcls config (yzd-v/cls_KD) is not transcribed",
}
UNCHECKED_RECIPES = {
    "imagenet/ofd/resnet34_resnet18.yaml": "mdistiller has no r34_r18/ofd.yaml; the solver is "
                                           "its ImageNet CRD/ReviewKD one (batch 256, lr 0.1)",
    "imagenet/wttm/resnet34_resnet18.yaml": "zkxufo/TTM has CIFAR-100 code only",
    "imagenet/wttm/resnet50_mobilenetv1.yaml": "zkxufo/TTM has CIFAR-100 code only",
    "imagenet/teachers/resnet34.yaml": "the papers use torchvision's released weights",
    "imagenet/teachers/resnet50.yaml": "the papers use torchvision's released weights",
}
MDISTILLER_CIFAR = ("kd", "fitnet", "ofd", "crd", "reviewkd", "at", "vid")
MDISTILLER_IMAGENET = ("kd", "dkd", "at", "crd", "reviewkd", "ofd")


def _src(repo: str, *path: str) -> str:
    """``repo@commit:path``; a path of the official repository is given in parts (not a path of this one)."""
    return f"{repo}@{COMMITS[repo]}:{'/'.join(path)}"


def follows(rel: str) -> str:
    """The official file (and commit) ``rel`` (``area/method/stem.yaml``) follows."""
    area, method, name = rel.split("/")
    stem = name.removesuffix(".yaml")
    if method in UNCHECKED or rel in UNCHECKED_RECIPES:
        return f"no official file checked ({UNCHECKED.get(method) or UNCHECKED_RECIPES[rel]})"
    teachers = ("resnet32x4", "resnet110", "resnet56", "wrn_40_2", "vgg13", "resnet50_cifar", "resnet34", "resnet50")
    teacher = next((t for t in teachers if stem.startswith(t + "_")), None)
    pair = STEMS.get((teacher, stem[len(teacher) + 1:])) if teacher else None
    md, dkl, ls = "megvii-research/mdistiller", "jiequancui/DKL", "sunshangquan/logit-standardization-KD"
    if method == "teachers":
        return _src("penghui-yang/DHKD", "train_teacher.py")
    if area == "cifar100":
        if method == "dkd":
            return _src(md, f"configs/cifar100/dkd/{pair}.yaml")
        if method in MDISTILLER_CIFAR:
            return _src(md, f"configs/cifar100/{method}.yaml") + f" + solver of configs/cifar100/dkd/{pair}.yaml"
        if method == "ikl_kd":
            return _src(dkl, f"DKLv1/KD-dkl/cifar100_kd_dkl_configs/{pair}.yaml")
        if method == "dhkd":
            return _src("penghui-yang/DHKD", "train_student.py") + " + README flags"
        if method == "wttm":
            return _src("zkxufo/TTM", "train_student.py")
        if method == "ctkd":
            return _src("zhengli97/CTKD", "train_student.py") + " + scripts/run_cifar_distill.sh"
        if method == "mlkd":
            return _src("Jin-Ying/Multi-Level-Logit-Distillation", "configs", "cifar100/ours/res32x4_res8x4.yaml")
        base = method.removesuffix("_ls")
        return _src(ls, f"configs/cifar100/{base}/resnet32x4_resnet8x4.yaml") + \
            " with --logit-stand --base-temp 2 --kd-weight 9"
    if method in MDISTILLER_IMAGENET:
        return _src(md, f"configs/imagenet/{pair}/{method}.yaml")
    if method == "ikl_kd":
        return _src(dkl, f"DKLv1/KD-dkl/imagenet_kd_dkl_configs/{ {'r34_r18': 'r34_r18', 'r50_mv1': 'r50_mv'}[pair] }"
                         "_ikl_kd.yaml")
    if method == "dhkd":
        return _src("penghui-yang/DHKD", "train_student_imagenet.py") + " + README flags"
    if method == "ctkd":
        return _src("zhengli97/CTKD", "train_student.py") + " + scripts/run_imagenet_distill.sh"
    if method == "mlkd":
        return _src("Jin-Ying/Multi-Level-Logit-Distillation", "configs", "imagenet/r34_r18/kd_ours.yaml")
    raise KeyError(rel)


_GI = ("kdcollapse always weights the wMSE by class means of softmax(z_t / T2) (global information); the official "
       "CIFAR-100 configs (GI False) weight by each sample's softmax(z_t / 100); both are close to uniform at T2 = 100")
_WTTM = ("zkxufo/TTM publishes no standalone WTTM setting (its README gives TTM's -b 45 --ttm_l 0.1 and CRD + WTTM's "
         "-a 4 --ttm_l 0.2); gamma 0.2 and weight 4 are the latter's; the paper's App. A.4 values are not in the "
         "repository: tune them")
_PER_PROCESS = ("per process; the official batch is the total over 8 GPUs: with torchrun --nproc_per_node=8 "
                "give data.batch_size={per} (the header's command)")


def deviations(rel: str) -> dict[str, str]:
    """Recipe (or official) field -> why the recipe deliberately differs from the file it follows."""
    area, method, _ = rel.split("/")
    out: dict[str, str] = {}
    if method == "ikl_kd" and area == "cifar100":
        out["official.IKL_KD.GI"] = _GI
    if method == "wttm":
        out |= {"method.gamma": _WTTM, "method.wttm_weight": _WTTM}
    return out
