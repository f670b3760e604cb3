"""Write tests/data/official_recipes.yaml: the official hyperparameters behind every CIFAR-100 / ImageNet recipe.

    python tests/data/extract_official_recipes.py /work/.mirror      # a folder of <owner>+<name>/repo git clones

Not run by the test suite (it needs the official repositories); its output is committed and read by
tests/test_official_recipes.py. The values are read from the official files at the commits in COMMITS —
mdistiller-style yacs files merged over their repository's own ``engine/cfg.py`` defaults (as
``tools/train.py`` does), argparse defaults plus the README's flags for the argparse-driven code — and
translated to kdcollapse's field names by the small TRANSLATE functions below. It never reads
configs/generate.py, so the table is an independent transcription of the official values.
"""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from pathlib import Path

import yaml

COMMITS = {
    "megvii-research/mdistiller": "a08d46f10d6102bd6e3f258ca5ac880b020ea259",
    "jiequancui/DKL": "c5e8ad2e24ec53f3682a68db99de372fc80f59ca",
    "penghui-yang/DHKD": "7976c69d408e72b4203d04a6e82dc27792ec1469",
    "sunshangquan/logit-standardization-KD": "f6e5aa5172bad618e801163c3385322eea673754",
    "Jin-Ying/Multi-Level-Logit-Distillation": "5ee473fcf193dfb00a0598b64d0acfe6ad58a482",
    "zkxufo/TTM": "fe457b33a71ba27536ec04fe3d32c5b04963522f",
    "zhengli97/CTKD": "7d5252241259ae70d38a832371fed9697d15fc14",
    "dvlab-research/ReviewKD": "cede6ea6387ae9b6127de0e561507177bf19c11e",
}
# Recipes whose official configuration file is not in a repository fetched here (they stay listed, unchecked).
UNCHECKED_RECIPES = {
    "imagenet/wttm/resnet34_resnet18.yaml": "zkxufo/TTM has CIFAR-100 code only (the authors ran ImageNet in torchdistill)",
    "imagenet/wttm/resnet50_mobilenetv1.yaml": "zkxufo/TTM has CIFAR-100 code only (the authors ran ImageNet in torchdistill)",
    "imagenet/teachers/resnet34.yaml": "the papers use torchvision's released weights; no training config is given",
    "imagenet/teachers/resnet50.yaml": "the papers use torchvision's released weights; no training config is given",
}
UNCHECKED = {
    "dist": "DIST's configs live in the submodule hunto/image_classification_sota, not in hunto/DIST_KD@2418f18",
    "nkd": "NKD's ImageNet config is an mmcls config of yzd-v/cls_KD not transcribed here",
}
# kdcollapse names of the official model names.
MODELS = {"ShuffleV1": "shufflev1", "ShuffleV2": "shufflev2", "MobileNetV2": "mobilenetv2", "ResNet50": "resnet50_cifar",
          "ResNet34": "resnet34", "ResNet18": "resnet18", "MobileNetV1": "mobilenetv1"}
IMAGENET_MODELS = {"ResNet50": "resnet50"}
# mdistiller's per-pair file stems (configs/cifar100/dkd/<stem>.yaml) -> (teacher, student) in kdcollapse names.
CIFAR_PAIRS = {
    "res56_res20": ("resnet56", "resnet20"), "res110_res32": ("resnet110", "resnet32"),
    "res32x4_res8x4": ("resnet32x4", "resnet8x4"), "wrn40_2_wrn_16_2": ("wrn_40_2", "wrn_16_2"),
    "wrn40_2_wrn_40_1": ("wrn_40_2", "wrn_40_1"), "vgg13_vgg8": ("vgg13", "vgg8"),
    "res32x4_shuv1": ("resnet32x4", "shufflev1"), "wrn40_2_shuv1": ("wrn_40_2", "shufflev1"),
    "vgg13_mv2": ("vgg13", "mobilenetv2"), "res50_mv2": ("resnet50_cifar", "mobilenetv2"),
    "res32x4_shuv2": ("resnet32x4", "shufflev2"),
}
IMAGENET_PAIRS = {"r34_r18": ("resnet34", "resnet18"), "r50_mv1": ("resnet50", "mobilenetv1")}
LIGHT = ("shufflev1", "shufflev2", "mobilenetv2")


class Repo:
    def __init__(self, mirrors: Path, name: str):
        self.name, self.commit = name, COMMITS[name]
        self.git = mirrors / name.replace("/", "+") / "repo"

    def show(self, path: str) -> str:
        return subprocess.run(["git", "-C", str(self.git), "show", f"{self.commit}:{path}"], check=True,
                              capture_output=True, text=True).stdout

    def source(self, path: str) -> str:
        return f"{self.name}@{self.commit[:7]}:{path}"


# ------------------------------------------------------------------------------ yacs (mdistiller family)
class _Node(dict):
    def __getattr__(self, key):
        return self[key]

    def __setattr__(self, key, value):
        self[key] = value


def yacs_defaults(repo: Repo, cfg_py: str) -> dict:
    """The CFG of ``cfg_py`` (a yacs file) without yacs: CfgNode replaced by an attribute dict."""
    fake = types.ModuleType("yacs.config")
    fake.CfgNode = _Node
    sys.modules.setdefault("yacs", types.ModuleType("yacs"))
    sys.modules["yacs.config"] = fake
    namespace: dict = {"__name__": "official_cfg"}
    text = re.sub(r"^from \..*$", "", repo.show(cfg_py), flags=re.M)  # its logging helpers only
    exec(compile(text, cfg_py, "exec"), namespace)
    return namespace["CFG"]


def merged(defaults: dict, override: dict) -> dict:
    out = {k: (merged(v, {}) if isinstance(v, dict) else v) for k, v in defaults.items()}
    for key, value in (override or {}).items():
        out[key] = merged(out.get(key, {}), value) if isinstance(value, dict) else value
    return out


def yacs(repo: Repo, cfg_py: str, path: str, opts: dict | None = None) -> dict:
    cfg = merged(yacs_defaults(repo, cfg_py), yaml.safe_load(repo.show(path)))
    return merged(cfg, opts or {})


def solver(cfg: dict, dataset: str) -> dict:
    s = cfg["SOLVER"]
    assert s["TYPE"] == "SGD"
    out = {"data.batch_size": s["BATCH_SIZE"], "optim.lr": s["LR"], "optim.momentum": s["MOMENTUM"],
           "optim.weight_decay": s["WEIGHT_DECAY"], "schedule.name": "multistep",
           "schedule.milestones": list(s["LR_DECAY_STAGES"]), "schedule.gamma": s["LR_DECAY_RATE"],
           "train.epochs": s["EPOCHS"]}
    student = cfg["DISTILLER"]["STUDENT"]
    out["model.name"] = (IMAGENET_MODELS | MODELS if dataset == "imagenet" else MODELS).get(student, student)
    return out | augmentation(dataset)


def augmentation(dataset: str) -> dict:
    # mdistiller/dataset/cifar100.py: RandomCrop(32, padding=4) + RandomHorizontalFlip; imagenet.py:
    # RandomResizedCrop(224) + RandomHorizontalFlip (kdcollapse's ImageNet loader does the resized crop itself).
    return {"data.crop_padding": 4, "data.flip": True} if dataset == "cifar100" else {"data.flip": True}


def translate(method: str, cfg: dict) -> dict:
    """kdcollapse's method fields from an mdistiller-style CFG."""
    if method in ("kd", "mlkd"):
        kd = cfg["KD"]
        return {"method.temperature": kd["TEMPERATURE"], "method.ce_weight": kd["LOSS"]["CE_WEIGHT"],
                "method.kd_weight": kd["LOSS"]["KD_WEIGHT"]}
    if method == "dkd":
        d = cfg["DKD"]
        return {"method.alpha": d["ALPHA"], "method.beta": d["BETA"], "method.temperature": d["T"],
                "method.ce_weight": d["CE_WEIGHT"], "method.warmup_epochs": d["WARMUP"]}
    if method == "ikl_kd":  # official (BETA, ALPHA) = (wMSE, soft CE) weights
        d = cfg["IKL_KD"]
        return {"method.mse_weight": d["BETA"], "method.soft_ce_weight": d["ALPHA"], "method.temperature": d["T"],
                "method.weight_temperature": d["T2"], "method.ce_weight": d["CE_WEIGHT"],
                "method.warmup_epochs": d["WARMUP"], "official.IKL_KD.GI": d["GI"]}
    if method == "at":
        return {"method.ce_weight": cfg["AT"]["LOSS"]["CE_WEIGHT"], "method.feat_weight": cfg["AT"]["LOSS"]["FEAT_WEIGHT"],
                "method.p": float(cfg["AT"]["P"])}
    if method == "ofd":
        return {"method.ce_weight": cfg["OFD"]["LOSS"]["CE_WEIGHT"], "method.feat_weight": cfg["OFD"]["LOSS"]["FEAT_WEIGHT"]}
    if method == "fitnet":
        f = cfg["FITNET"]
        return {"method.ce_weight": f["LOSS"]["CE_WEIGHT"], "method.hint_weight": f["LOSS"]["FEAT_WEIGHT"],
                "method.student_stage": f["HINT_LAYER"], "method.teacher_stage": f["HINT_LAYER"]}
    if method == "crd":
        c = cfg["CRD"]
        return {"method.ce_weight": c["LOSS"]["CE_WEIGHT"], "method.crd_weight": c["LOSS"]["FEAT_WEIGHT"],
                "method.feat_dim": c["FEAT"]["DIM"], "method.num_negatives": c["NCE"]["K"],
                "method.temperature": c["NCE"]["TEMPERATURE"], "method.momentum": c["NCE"]["MOMENTUM"]}
    if method == "reviewkd":
        r = cfg["REVIEWKD"]
        return {"method.ce_weight": r["CE_WEIGHT"], "method.reviewkd_weight": r["REVIEWKD_WEIGHT"],
                "method.warmup_epochs": r["WARMUP_EPOCHS"], "method.student_pre_act": r["STU_PREACT"]}
    if method == "vid":
        v = cfg["VID"]  # mdistiller/distillers/VID.py keeps log_scales in a plain list: never optimised
        return {"method.ce_weight": v["LOSS"]["CE_WEIGHT"], "method.vid_weight": v["LOSS"]["FEAT_WEIGHT"],
                "method.init_variance": v["INIT_PRED_VAR"], "method.learn_variance": False}
    raise KeyError(method)


def cifar_mdistiller(md: Repo, table: dict) -> None:
    for stem, (teacher, student) in CIFAR_PAIRS.items():
        pair_file = f"configs/cifar100/dkd/{stem}.yaml"
        dkd = yacs(md, "mdistiller/engine/cfg.py", pair_file)
        table[f"cifar100/dkd/{teacher}_{student}.yaml"] = entry(md.source(pair_file), solver(dkd, "cifar100")
                                                                 | translate("dkd", dkd))
        for method in ("kd", "fitnet", "ofd", "crd", "reviewkd", "at", "vid"):
            path = f"configs/cifar100/{method}.yaml"
            # the method's file with the pair's solver and models (the method files are written for
            # resnet32x4 -> resnet8x4 and share that pair's solver, which is the per-pair DKD file's solver)
            cfg = merged(yacs(md, "mdistiller/engine/cfg.py", path), {"SOLVER": dkd["SOLVER"],
                                                                      "DISTILLER": dkd["DISTILLER"]})
            values = solver(cfg, "cifar100") | translate(method, cfg)
            if method == "reviewkd":  # the per-pair weight is the ReviewKD authors' CIFAR script's
                values["method.reviewkd_weight"] = REVIEWKD_SCRIPT.get((teacher, student), 1.0)
            table[f"cifar100/{method}/{teacher}_{student}.yaml"] = entry(
                f"{md.source(path)} + solver of {pair_file}", values)


REVIEWKD_SCRIPT: dict = {}


def reviewkd_script(rk: Repo) -> None:
    names = {"wrn-16-2": "wrn_16_2", "wrn-40-1": "wrn_40_1", "wrn-40-2": "wrn_40_2"}
    for line in rk.show("CIFAR-100/script/reviewKD.sh").splitlines():
        m = re.search(r"--model (\S+) --teacher (\S+) .*--kd-loss-weight (\S+)", line)
        if m:
            s, t, w = m.groups()
            REVIEWKD_SCRIPT[(names.get(t, t), names.get(s, s))] = float(w)


def imagenet_mdistiller(md: Repo, table: dict) -> None:
    for stem, (teacher, student) in IMAGENET_PAIRS.items():
        for method in ("kd", "dkd", "at", "crd", "reviewkd", "ofd"):
            path = f"configs/imagenet/{stem}/{method}.yaml"
            try:
                cfg = yacs(md, "mdistiller/engine/cfg.py", path)
            except subprocess.CalledProcessError:
                table[f"imagenet/{method}/{teacher}_{student}.yaml"] = {"unchecked": f"mdistiller has no {path}"}
                continue
            table[f"imagenet/{method}/{teacher}_{student}.yaml"] = entry(
                md.source(path), solver(cfg, "imagenet") | translate(method, cfg))


def dkl(repo: Repo, table: dict) -> None:
    cfg_py = "DKLv1/KD-dkl/mdistiller/engine/cfg.py"
    for stem, (teacher, student) in CIFAR_PAIRS.items():
        path = f"DKLv1/KD-dkl/cifar100_kd_dkl_configs/{stem}.yaml"  # the files sh/cifar100_ikl.sh runs
        cfg = yacs(repo, cfg_py, path)
        table[f"cifar100/ikl_kd/{teacher}_{student}.yaml"] = entry(repo.source(path), solver(cfg, "cifar100")
                                                                    | translate("ikl_kd", cfg))
    for stem, (teacher, student) in {"r34_r18_ikl_kd": IMAGENET_PAIRS["r34_r18"],
                                     "r50_mv_ikl_kd": IMAGENET_PAIRS["r50_mv1"]}.items():
        path = f"DKLv1/KD-dkl/imagenet_kd_dkl_configs/{stem}.yaml"
        cfg = yacs(repo, cfg_py, path)
        table[f"imagenet/ikl_kd/{teacher}_{student}.yaml"] = entry(repo.source(path), solver(cfg, "imagenet")
                                                                    | translate("ikl_kd", cfg))


def mlkd_and_ls(mlkd: Repo, ls: Repo, table: dict) -> None:
    path = "/".join(("configs", "cifar100/ours/res32x4_res8x4.yaml"))  # MLKD's own repository
    cfg = yacs(mlkd, "mdistiller/engine/cfg.py", path)
    table["cifar100/mlkd/resnet32x4_resnet8x4.yaml"] = entry(mlkd.source(path), solver(cfg, "cifar100")
                                                             | translate("mlkd", cfg))
    path = "/".join(("configs", "imagenet/r34_r18/kd_ours.yaml"))
    cfg = yacs(mlkd, "mdistiller/engine/cfg.py", path)
    table["imagenet/mlkd/resnet34_resnet18.yaml"] = entry(mlkd.source(path), solver(cfg, "imagenet")
                                                          | translate("mlkd", cfg))
    # logit standardization: tools/train.py --logit-stand --base-temp 2 --kd-weight 9 (its README's commands)
    for ours, method, path in (("kd_ls", "kd", "configs/cifar100/kd/resnet32x4_resnet8x4.yaml"),
                               ("dkd_ls", "dkd", "configs/cifar100/dkd/resnet32x4_resnet8x4.yaml"),
                               ("mlkd_ls", "mlkd", "configs/cifar100/mlkd/resnet32x4_resnet8x4.yaml")):
        cfg = yacs(ls, "mdistiller/engine/cfg.py", path)
        if method == "dkd":
            cfg["DKD"] |= {"ALPHA": cfg["DKD"]["ALPHA"] * 9, "BETA": cfg["DKD"]["BETA"] * 9, "T": 2.0}
        else:
            cfg["KD"] = merged(cfg["KD"], {"TEMPERATURE": 2.0, "LOSS": {"KD_WEIGHT": 9.0}})
        table[f"cifar100/{ours}/resnet32x4_resnet8x4.yaml"] = entry(
            ls.source(path) + " with --logit-stand --base-temp 2 --kd-weight 9",
            solver(cfg, "cifar100") | translate(method, cfg) | {"method.logit_standardization": True})


# ---------------------------------------------------------------------------------- argparse-driven code
def argparse_defaults(text: str) -> dict:
    """``dest -> default`` of every ``parser.add_argument`` with a literal default."""
    out = {}
    for call in re.finditer(r"add_argument\((.*?)\)\s*$", text, re.M):
        try:
            node = ast.parse(f"f({call.group(1)})").body[0].value
        except SyntaxError:
            continue
        flags = [a.value for a in node.args if isinstance(a, ast.Constant)]
        kw = {k.arg: k.value for k in node.keywords}
        if "default" in kw and flags:
            try:
                out[max(flags, key=len).lstrip("-").replace("-", "_")] = ast.literal_eval(kw["default"])
            except ValueError:
                pass
    return out


def cifar_solver(args: dict, student: str) -> dict:
    lr = args["learning_rate"] * (0.2 if student in LIGHT else 1.0)  # DHKD/CRD: x0.2 for the light students
    return {"data.batch_size": args["batch_size"], "optim.lr": round(lr, 10), "optim.momentum": args["momentum"],
            "optim.weight_decay": args["weight_decay"], "schedule.name": "multistep",
            "schedule.milestones": [int(e) for e in args["lr_decay_epochs"].split(",")],
            "schedule.gamma": args["lr_decay_rate"], "train.epochs": args["epochs"], "model.name": student,
            **augmentation("cifar100")}


def dhkd(repo: Repo, table: dict) -> None:
    """train_student.py's defaults with the README's flags: --dual_head --ga --distill dhkd -r 1 --BinaryKL_T 2,
    --nonlinear for the cross-architecture pairs (README, Table 2); alpha is the paper's (App. F, J)."""
    args = argparse_defaults(repo.show("train_student.py"))
    alpha = {("resnet56", "resnet20"): 0.1, ("resnet110", "resnet32"): 0.1, ("resnet32x4", "resnet8x4"): 2.0}
    for teacher, student in CIFAR_PAIRS.values():
        cross = student in LIGHT
        table[f"cifar100/dhkd/{teacher}_{student}.yaml"] = entry(repo.source("train_student.py") + " + README flags", (
            cifar_solver(args, student) | {"method.ce_weight": 1.0, "method.temperature": args["BinaryKL_T"],
                                           "method.alpha": alpha.get((teacher, student), 1.0),
                                           "method.aux_head": "mlp" if cross else "linear",
                                           "method.alignment": "global"}))
    args = argparse_defaults(repo.show("train_student_imagenet.py"))
    for teacher, student in IMAGENET_PAIRS.values():
        table[f"imagenet/dhkd/{teacher}_{student}.yaml"] = entry(
            repo.source("train_student_imagenet.py") + " + README flags", {
                "data.batch_size": args["batch_size"], "optim.lr": args["learning_rate"],
                "optim.momentum": args["momentum"], "optim.weight_decay": args["weight_decay"],
                "schedule.name": "multistep", "schedule.milestones": [30, 60, 90],
                "schedule.gamma": args["lr_decay_rate"], "train.epochs": args["epochs"], "model.name": student,
                "data.flip": True, "method.ce_weight": 1.0, "method.alpha": 0.1,
                "method.temperature": args["BinaryKL_T"], "method.aux_head": "linear", "method.alignment": "off",
                "method.distill_until": args["early_stop_epoch"]})
    args = argparse_defaults(repo.show("train_teacher.py"))
    for teacher in {t for t, _ in CIFAR_PAIRS.values()}:
        values = cifar_solver(args, teacher) | {"method.name": "vanilla"}
        table[f"cifar100/teachers/{teacher}.yaml"] = entry(repo.source("train_teacher.py"), values)


def ttm(repo: Repo, table: dict, pairs) -> None:
    args = argparse_defaults(repo.show("train_student.py"))
    for teacher, student in pairs:
        table[f"cifar100/wttm/{teacher}_{student}.yaml"] = entry(repo.source("train_student.py"), (
            cifar_solver(args, student) | {"method.ce_weight": args["gamma"]}))


def ctkd(repo: Repo, table: dict, pairs) -> None:
    """train_student.py's defaults with the flags of scripts/run_cifar_distill.sh (and run_imagenet_distill.sh):
    cosine curriculum of the temperature's gradient reversal from decay_max 0 to decay_min -1 (lambda_max 1)."""
    args = argparse_defaults(repo.show("train_student.py"))
    for area, script_path in (("cifar100", "scripts/run_cifar_distill.sh"), ("imagenet", "scripts/run_imagenet_distill.sh")):
        script = repo.show(script_path)
        flags = dict(re.findall(r"(?:^|\s)(-r|-a|--batch_size|--learning_rate|--decay_loops|--decay_min|--epochs|"
                                r"--weight_decay|--lr_decay_epochs|--t_start|--t_end)\s+(\S+)", script))
        method = {"method.ce_weight": float(flags["-r"]), "method.kd_weight": float(flags["-a"]),
                  "method.t_start": float(flags.get("--t_start", args["t_start"])),
                  "method.t_end": float(flags.get("--t_end", args["t_end"])),
                  "method.lambda_max": -float(flags["--decay_min"]),
                  "method.curriculum_epochs": int(float(flags["--decay_loops"]))}
        run = args | {"batch_size": int(flags["--batch_size"]), "learning_rate": float(flags["--learning_rate"]),
                      "epochs": int(flags.get("--epochs", args["epochs"])),
                      "weight_decay": float(flags.get("--weight_decay", args["weight_decay"])),
                      "lr_decay_epochs": flags.get("--lr_decay_epochs", args["lr_decay_epochs"])}
        for teacher, student in (pairs if area == "cifar100" else [IMAGENET_PAIRS["r34_r18"]]):
            values = cifar_solver(run, student) | method
            if area == "imagenet":
                del values["data.crop_padding"]
            table[f"{area}/ctkd/{teacher}_{student}.yaml"] = entry(
                f"{repo.source('train_student.py')} + {script_path}", values)


def entry(source: str, values: dict) -> dict:
    return {"source": source, "official": {k: values[k] for k in sorted(values)}}


def main(mirrors: Path) -> dict:
    repos = {name: Repo(mirrors, name) for name in COMMITS}
    table: dict = {}
    reviewkd_script(repos["dvlab-research/ReviewKD"])
    cifar_mdistiller(repos["megvii-research/mdistiller"], table)
    imagenet_mdistiller(repos["megvii-research/mdistiller"], table)
    dkl(repos["jiequancui/DKL"], table)
    mlkd_and_ls(repos["Jin-Ying/Multi-Level-Logit-Distillation"], repos["sunshangquan/logit-standardization-KD"], table)
    dhkd(repos["penghui-yang/DHKD"], table)
    configs = Path(__file__).resolve().parents[2] / "configs"  # which pairs the WTTM and CTKD tables list
    ttm(repos["zkxufo/TTM"], table, [split_stem(p) for p in (configs / "cifar100" / "wttm").glob("*.yaml")])
    ctkd(repos["zhengli97/CTKD"], table, [split_stem(p) for p in (configs / "cifar100" / "ctkd").glob("*.yaml")])
    recipes = {str(p.relative_to(configs)) for area in ("cifar100", "imagenet") for p in (configs / area).rglob("*.yaml")}
    for rel in sorted(recipes - set(table)):
        method = rel.split("/")[1]
        table[rel] = {"unchecked": UNCHECKED.get(method) or UNCHECKED_RECIPES[rel]}
    return {"commits": COMMITS, "recipes": {k: table[k] for k in sorted(table) if k in recipes}}


def split_stem(path: Path) -> tuple[str, str]:
    teachers = ("resnet32x4", "resnet110", "resnet56", "wrn_40_2", "vgg13", "resnet50_cifar")
    teacher = next(t for t in teachers if path.stem.startswith(t + "_"))
    return teacher, path.stem[len(teacher) + 1:]


if __name__ == "__main__":
    out = Path(__file__).with_name("official_recipes.yaml")
    header = ("# The official hyperparameters of every CIFAR-100/ImageNet recipe, read from the official repositories\n"
              "# at the commits below by tests/data/extract_official_recipes.py (do not edit by hand; rerun it).\n")
    out.write_text(header + yaml.safe_dump(main(Path(sys.argv[1])), sort_keys=False, width=120, default_flow_style=None))
    print(out)
