"""Write every distillation recipe under configs/ from the tables of configs/recipe_tables/.

    python configs/generate.py          # (re)write configs/cifar100, imagenet, fashion_mnist, fashion_mnist_pairs
    python configs/generate.py --check  # exit 1 if a committed recipe differs from this script's output

One row per teacher -> student pair; the methods' official hyperparameters are filled in once, in one module
per table of configs/recipe_tables/ (dhkd_tables, baselines, feature_methods, logit_methods, fashion_mnist;
common holds the solvers and the rendering), so the recipes cannot drift apart. Each file names the paper
number it should reproduce in its header.
Sources: DHKD paper Tables 1-4, App. F, J (Table 11); DKL paper Tables 3, 5; mdistiller's DKD configs;
the official DKL/IKL code (see docs/distillation.md); for NKD, WTTM, CTKD, MLKD and logit standardization
their official repositories (recipe_tables/logit_methods.py); configs/provenance.py names the official file
and commit each CIFAR-100/ImageNet recipe follows and its deliberate deviations (tests/test_official_recipes.py
checks every field against tests/data/official_recipes.yaml); for the baselines of issue 23, mdistiller's
configs and the DIST authors' code and README. configs/fashion_mnist/teacher.yaml and
configs/fashion_mnist_pairs/teacher.yaml are hand-written and are the bases of their student recipes.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent


def _load(name: str, path: Path, package: bool = False):
    """A module of configs/ by path (this script also runs loaded from its path by the tests): the tables
    are a package, ``recipe_tables``, so that its modules import each other relatively."""
    spec = importlib.util.spec_from_file_location(
        name, path / "__init__.py" if package else path, submodule_search_locations=[str(path)] if package else None)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses, and the package's relative imports, look their module up there
    spec.loader.exec_module(module)
    return module


provenance = _load("recipe_provenance", ROOT / "provenance.py")
deviations = provenance.deviations
_load("recipe_tables", ROOT / "recipe_tables", package=True)
tables = {name: importlib.import_module(f"recipe_tables.{name}")
          for name in ("dhkd_tables", "baselines", "feature_methods", "logit_methods", "fashion_mnist")}


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
    dhkd, baselines, features, logit, fmnist = tables.values()
    out = (dhkd.cifar_teachers() | dhkd.imagenet_teachers() | dhkd.student_recipes() | baselines.baseline_recipes()
           | fmnist.fmnist_recipes() | fmnist.pairs_recipes() | logit.logit_recipes() | features.feature_recipes()
           | fmnist.fmnist_feature_recipes())
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
