"""Write the papers' CIFAR-100 tables as study files, at full protocol, from the recipe tables.

    python studies/papers/generate.py          # (re)write studies/papers/{cifar100,intra_class_cifar100}/study.yaml
    python studies/papers/generate.py --check  # exit 1 if a committed study file differs from this script's output

The published numbers and the runs' recipes come from one place, the tables of configs/generate.py (in
configs/recipe_tables/: DHKD Tables 1-2, the DKL paper's Table 5, the DKD / MLKD / logit-standardization rows)
and configs/intra_class/generate.py
(the intra-class paper's Tables 1-2), so a study cell, its recipe's header and the number beside it cannot drift
apart. Each run is its recipe unchanged (``configs/cifar100/<method>/<pair>.yaml``: 240 epochs, batch 64, the
official hyperparameters) on one GPU: every group asks SLURM for ``resources: {gpus: 1, ...}``, so each run is
one task of a job array with its own GPU (submitit's ``gpus_per_node``), as many at a time as the cluster has GPUs.

tests/test_paper_studies.py checks that the committed files are this script's output, reads every run's config
as it would train, and runs a tiny variant of the same files (:func:`cifar100` with ``protocol`` and ``pairs``) end
to end on fake CIFAR-format data, with teachers converted from a tar of the format of mdistiller's
``cifar_teachers.tar``: one row in-process, and (heavy) every row through the one-node SLURM cluster into a page.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import yaml

from kdcollapse.recipes import regenerate

ROOT = Path(__file__).resolve().parent
CONFIGS = ROOT.parents[1] / "configs"
# One run per GPU; a job that times out is requeued and resumes from its last epoch.
GPU = {"gpus": 1, "cpus": 8, "mem_gb": 32, "minutes": 720}
TEACHERS = "runs/cifar100"  # where `kdcollapse models convert --from mdistiller cifar_teachers.tar runs/cifar100` writes


def _load(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


recipes = _load(CONFIGS / "generate.py", "recipe_generator")  # its tables: configs/recipe_tables/
dhkd, baselines, features, logit = (recipes.tables[name] for name in
                                    ("dhkd_tables", "baselines", "feature_methods", "logit_methods"))
intra = _load(CONFIGS / "intra_class" / "generate.py", "intra_class_tables")

# method stem -> (its name in the papers, where its numbers are printed)
NAMES = {"kd": "KD", "dkd": "DKD", "dhkd": "DHKD", "ikl_kd": "IKL-KD", "fitnet": "FitNet", "ofd": "OFD", "crd": "CRD",
         "reviewkd": "ReviewKD", "mlkd": "MLKD", "kd_ls": "KD + LS", "dkd_ls": "DKD + LS", "mlkd_ls": "MLKD + LS"}
DHKD_METHODS = ("kd", "fitnet", "ofd", "crd", "reviewkd", "dkd", "dhkd")  # DHKD Tables 1-2, in the paper's row order
LOGIT_ROWS = ("mlkd", "kd_ls", "dkd_ls", "mlkd_ls")  # on resnet32x4 -> resnet8x4


def arrow(teacher: str, student: str) -> str:
    return f"{teacher} → {student}"


def published(method: str, teacher: str, student: str) -> str | None:
    """The paper's top-1 (%) of ``method`` on the pair, as printed; None where our copies have none."""
    key = (teacher, student)
    pair = next((p for p in dhkd.CIFAR_PAIRS if (p.teacher, p.student) == key), None)
    if method in dhkd.METHODS:
        number = pair.paper[method]
    elif method in baselines.BASELINES_CIFAR:
        number = baselines.BASELINES_CIFAR[method][0].get(f"{teacher}_{student}")
    elif method in features.FEATURE_PAPER:
        number = features.FEATURE_PAPER[method].get(key)
    else:
        number = logit.LOGIT_CIFAR[method][2].get(key)
    return None if number is None else (number if isinstance(number, str) else f"{number:.2f}")


def source(method: str) -> str:
    if method == "ikl_kd":
        return "DKL paper, Table 5"
    if method in LOGIT_ROWS:
        return logit.LOGIT_CIFAR[method][0]
    return "DHKD paper, Tables 1-2"


def _group(method: str, pairs: list, protocol: dict, teachers: str, resources: dict | None) -> dict:
    group = {"group": method, "run": f"{method}/{{pair}}/seed{{seed}}", "config": f"cifar100/{method}/{{pair}}",
             "grid": {"pair": [{"pair": f"{p.teacher}_{p.student}", "teacher": p.teacher} for p in pairs]},
             "overrides": [*protocol.get("all", []), *protocol.get(method, []),
                           f"teacher.checkpoint={teachers}/teacher_{{teacher}}"]}
    if resources:
        group["resources"] = dict(resources)
    return group


def _cell(method: str, teacher: str, student: str, group: str | None = None) -> dict:
    return {"label": f"{NAMES[method]}: {arrow(teacher, student)}", "group": group or method,
            "where": {"pair": f"{teacher}_{student}"}}


def _values(cells: list[dict], methods_of: dict) -> dict:
    out = {}
    for cell in cells:
        method, pair = methods_of[cell["label"]]
        out[cell["label"]] = published(method, *pair) or "—"
    return out


SUMMARY = {"select": None, "metric": {"metric": "test_acc", "at": "last", "label": "last-epoch test acc"},
           "columns": [{"metric": "test_acc", "at": "last", "label": "last-epoch test acc (%)"}],
           "noise_floor": 0.3}  # pp: 30 of the 10,000 test images


def cifar100(protocol: dict | None = None, teachers: str = TEACHERS, resources: dict | None = GPU,
             seeds=(0, 1, 2), runs_dir: str = "runs/papers/cifar100", pairs: list | None = None) -> dict:
    """The study of DHKD's Tables 1-2 (KD, FitNet, OFD, CRD, ReviewKD, DKD, DHKD on 11 pairs), the DKL paper's
    Table 5 (IKL-KD on its 6 pairs; its other rows are DHKD's runs) and the DKD/MLKD/LS rows (resnet32x4 ->
    resnet8x4): every run once, the sections pick the cells each table prints. ``protocol``: overrides per group
    (key ``all``: every group's) after the recipe's; ``pairs``: only these (teacher, student) pairs (the tests' tiny
    variant), a table without any left out."""
    protocol = protocol or {}
    pairs = [p for p in dhkd.CIFAR_PAIRS if pairs is None or (p.teacher, p.student) in pairs]
    same = [p for p in pairs if not p.cross_arch]
    res8x4 = [p for p in pairs if (p.teacher, p.student) == ("resnet32x4", "resnet8x4")]
    ikl = [p for p in same if p.paper["ikl_kd"] is not None]
    groups = [_group(m, pairs, protocol, teachers, resources) for m in DHKD_METHODS]
    groups += [_group("ikl_kd", ikl, protocol, teachers, resources)] if ikl else []
    groups += [_group(m, res8x4, protocol, teachers, resources) for m in LOGIT_ROWS] if res8x4 else []
    sections, tables, methods_of = [], [], {}

    def section(name: str, title: str, rows: list[tuple[str, object]], compare: list) -> None:
        if not rows:
            return
        cells = [_cell(m, p.teacher, p.student) for m, p in rows]
        methods_of.update({c["label"]: (m, (p.teacher, p.student)) for c, (m, p) in zip(cells, rows)})
        sections.append({"title": title, "cells": cells, "compare": compare})
        tables.append({"name": name, "section": len(sections) - 1,
                       "columns": [{"label": "published (%)", "values": _values(cells, methods_of), "missing": "—"}]})

    def vs_kd(rows, methods):
        return [[f"{NAMES[m]}: {arrow(p.teacher, p.student)}", f"KD: {arrow(p.teacher, p.student)}"]
                for p in rows for m in methods]

    for name, title, chosen in (("dhkd_table1", "DHKD paper Table 1: same architecture", same),
                                ("dhkd_table2", "DHKD paper Table 2: different architectures",
                                 [p for p in pairs if p.cross_arch])):
        section(name, title, [(m, p) for p in chosen for m in DHKD_METHODS], vs_kd(chosen, ("dkd", "dhkd")))
    section("dkl_table5", "DKL paper Table 5: IKL-KD against KD and DKD (same architecture)",
            [(m, p) for p in ikl for m in ("kd", "dkd", "ikl_kd")],
            vs_kd(ikl, ("ikl_kd",)) + [[f"IKL-KD: {arrow(p.teacher, p.student)}",
                                        f"DKD: {arrow(p.teacher, p.student)}"] for p in ikl])
    section("logit_rows", "DKD, MLKD and logit standardization: resnet32x4 → resnet8x4",
            [(m, p) for p in res8x4 for m in ("kd", "dkd", *LOGIT_ROWS)],
            [[f"{NAMES[m]}: resnet32x4 → resnet8x4", f"{base}: resnet32x4 → resnet8x4"]
             for m, base in (("kd_ls", "KD"), ("dkd_ls", "DKD"), ("mlkd_ls", "MLKD"), ("mlkd", "KD"))])
    return {"name": "cifar100", "runs_dir": runs_dir, "seeds": list(seeds), "groups": groups,
            "summary": {**SUMMARY, "sections": sections, "tables": tables}}


def intra_class_cifar100(protocol: dict | None = None, resources: dict | None = GPU, seeds=(0, 1, 2, 3, 4),
                         runs_dir: str = "runs/papers/intra_class_cifar100", pairs: list | None = None) -> dict:
    """The intra-class paper's CIFAR-100 columns of Tables 1-2: each teacher trained with L_intra in the study
    (configs/intra_class/cifar100/teacher_<model>.yaml, seed 0), then Ours (KD) and Ours+RKD from it, 5 seeds as the
    paper's means of 5 runs."""
    protocol = protocol or {}
    ds = next(d for d in intra.DATASETS if d.name == "cifar100")
    chosen = [p for p in ds.pairs if pairs is None or (p.teacher, p.student) in pairs]
    teachers = {"group": "teacher", "run": "teacher_{teacher}", "config": "intra_class/cifar100/teacher_{teacher}",
                "grid": {"teacher": [t for t in ds.teachers if any(p.teacher == t for p in chosen)]}, "seeds": [0],
                "overrides": [*protocol.get("all", []), *protocol.get("teacher", [])]}
    groups = [teachers]
    for suffix, group in (("", "ours"), ("_rkd", "ours_rkd")):
        groups.append({"group": group, "run": f"{group}/{{teacher}}-{{student}}/seed{{seed}}",
                       "config": f"intra_class/cifar100/{{teacher}}-{{student}}{suffix}",
                       "grid": {"pair": [{"teacher": p.teacher, "student": p.student} for p in chosen]},
                       "teacher": "teacher_{teacher}",
                       "overrides": [*protocol.get("all", []), *protocol.get(group, [])]})
    if resources:
        for group in groups:
            group["resources"] = dict(resources)
    sections, tables = [], []
    for table in ("Table 1", "Table 2"):
        pairs = [p for p in chosen if p.table == table]
        if not pairs:
            continue
        cells, values = [], {}
        for p in pairs:
            for group, name, number in (("ours", "Ours", p.ours), ("ours_rkd", "Ours+RKD", p.ours_rkd)):
                label = f"{name}: {arrow(p.teacher, p.student)}"
                cells.append({"label": label, "group": group, "where": {"teacher": p.teacher, "student": p.student}})
                values[label] = "—" if number is None else f"{number:.2f}"
        sections.append({"title": f"intra-class paper {table} (CIFAR-100)", "cells": cells,
                         "compare": [[f"Ours+RKD: {arrow(p.teacher, p.student)}", f"Ours: {arrow(p.teacher, p.student)}"]
                                     for p in pairs]})
        tables.append({"name": f"intra_{table.lower().replace(' ', '')}", "section": len(sections) - 1,
                       "columns": [{"label": "published (%)", "values": values, "missing": "—"}]})
    return {"name": "intra_class_cifar100", "runs_dir": runs_dir, "seeds": list(seeds), "groups": groups,
            "summary": {**SUMMARY, "sections": sections, "tables": tables}}


HEADERS = {
    "cifar100": [
        "The CIFAR-100 tables of the DHKD paper (Tables 1-2), the DKL paper (Table 5, IKL-KD) and the DKD / MLKD /",
        "logit-standardization rows, at full protocol: every run is its configs/cifar100 recipe unchanged, 3 seeds.",
        "Teachers: mdistiller's released cifar_teachers.tar (CRD's), converted once into runs/cifar100/teacher_<model>:",
        "  kdcollapse models convert --from mdistiller cifar_teachers.tar runs/cifar100",
        "  kdcollapse study run studies/papers/cifar100/study.yaml --executor slurm --partition gpu   # one run per GPU",
        "  kdcollapse study report studies/papers/cifar100/study.yaml   # the page, the published number beside each cell",
        "The papers report the mean of their runs' best test accuracy over the 240 epochs (mdistiller's best_acc, chosen",
        "on the test set); the page reports the last epoch's, which is at most that (about 0.1-0.3 pp lower).",
    ],
    "intra_class_cifar100": [
        "The intra-class contrastive KD paper's CIFAR-100 columns of Tables 1-2 at its protocol (§5.1: teacher batch",
        "256 lr 0.5, student batch 128 lr 0.05, 90 epochs, x0.1 at 30 and 60; configs/intra_class/cifar100, whose",
        "headers name what the paper leaves unsaid and what is chosen here); teachers trained in the study, 5 seeds.",
        "  kdcollapse study run studies/papers/intra_class_cifar100/study.yaml --executor slurm --partition gpu",
        "  kdcollapse study report studies/papers/intra_class_cifar100/study.yaml",
    ],
}


def render(name: str, body: dict) -> str:
    head = "".join(f"# {line}\n" for line in HEADERS[name])
    head += "# Generated by studies/papers/generate.py from the recipe tables; edit those, not this file.\n"
    return head + yaml.safe_dump(body, sort_keys=False, allow_unicode=True, width=120, default_flow_style=None)


def studies() -> dict[str, dict]:
    return {"cifar100": cifar100(), "intra_class_cifar100": intra_class_cifar100()}


def main(argv: list[str] | None = None) -> int:
    files = {ROOT / name / "study.yaml": render(name, body) for name, body in studies().items()}
    return regenerate(files, argv, __doc__, "studies/papers/generate.py")


if __name__ == "__main__":
    sys.exit(main())
