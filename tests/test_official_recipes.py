"""Every CIFAR-100 / ImageNet recipe against the official configuration it follows.

tests/data/official_recipes.yaml holds the official values, read from the official repositories at named
commits by tests/data/extract_official_recipes.py (which never reads configs/generate.py). Each recipe field
must equal its official value, or be a deviation the generator declares (and prints in the recipe's header)
and that really differs; each recipe's header names the official file and commit it follows."""

import dataclasses
from pathlib import Path

import pytest
import yaml

from kdcollapse.config import load_config
from test_recipes import CONFIGS, GENERATED, generator

OFFICIAL = yaml.safe_load((Path(__file__).parent / "data" / "official_recipes.yaml").read_text())["recipes"]
GEN = generator()
RECIPES = sorted(str(p) for p in GENERATED if p.parts[0] in ("cifar100", "imagenet"))
# Fields that are not hyperparameters of an official config: where the run lives, its seed, its teacher's
# directory, the dataset's name, and kdcollapse's own translations of what the official code hard-codes
# (mdistiller's feats[1:] stage lists, ReviewKD's channel cap, CRD's sampler, ImageNet loader workers).
# Official switches kdcollapse has no field for, and the value kdcollapse always behaves as: IKL-KD always
# weights its wMSE by class means of the teacher's probabilities (DKL's "global information", GI).
FIXED_BEHAVIOUR = {"official.IKL_KD.GI": True}
NOT_OFFICIAL = {"run_dir", "seed", "teacher.checkpoint", "data.name", "method.name", "data.num_workers",
                "method.student_stages", "method.teacher_stages", "method.mid_channels", "method.replacement"}


def leaves(tree: dict, prefix: str = ""):
    for key, value in tree.items():
        if isinstance(value, dict):
            yield from leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def effective(cfg, key: str):
    """The value the run uses (the recipe's, or the config default it leaves unset)."""
    value = cfg
    for part in key.split("."):
        value = getattr(value, part) if dataclasses.is_dataclass(value) else value[part]
    return value


def same(a, b) -> bool:
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        return list(a) == list(b)
    return a == pytest.approx(b, rel=1e-12) if isinstance(a, float) or isinstance(b, float) else a == b


def test_every_recipe_has_an_official_entry():
    assert set(RECIPES) == set(OFFICIAL)
    unchecked = sorted(rel for rel in RECIPES if "unchecked" in OFFICIAL[rel])
    # The recipes whose official file is not in a repository fetched here, by name: a new one must be named.
    assert unchecked == [*[f"cifar100/dist/{s}.yaml" for s in ("resnet32x4_resnet8x4", "resnet32x4_shufflev1",
                                                               "resnet32x4_shufflev2", "resnet50_cifar_mobilenetv2",
                                                               "resnet56_resnet20", "wrn_40_2_wrn_40_1")],
                         "imagenet/dist/resnet34_resnet18.yaml", "imagenet/dist/resnet50_mobilenetv1.yaml",
                         "imagenet/nkd/resnet34_resnet18.yaml", "imagenet/nkd/resnet50_mobilenetv1.yaml",
                         "imagenet/ofd/resnet34_resnet18.yaml", "imagenet/teachers/resnet34.yaml",
                         "imagenet/teachers/resnet50.yaml", "imagenet/wttm/resnet34_resnet18.yaml",
                         "imagenet/wttm/resnet50_mobilenetv1.yaml"]


@pytest.mark.parametrize("rel", RECIPES)
def test_recipe_equals_its_official_config(rel):
    entry = OFFICIAL[rel]
    text = (CONFIGS / rel).read_text()
    header = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#"))
    deviations = GEN.deviations(rel)
    for key, reason in deviations.items():
        assert f"Deviation ({key}): {reason}" in header.replace("\n# ", " "), (rel, key)
    if "unchecked" in entry:
        assert "Follows: no official file checked" in header, rel
        return
    assert f"Follows: {entry['source']}" in header.replace("\n# ", " "), rel
    cfg = load_config(CONFIGS / rel)
    official = entry["official"]
    for key, value in official.items():
        if key.startswith("official."):  # a switch kdcollapse has no field for: its fixed behaviour or a deviation
            assert (key in deviations) != (FIXED_BEHAVIOUR[key] == value), (rel, key, value)
            continue
        ours = effective(cfg, key)
        if key in deviations:
            assert not same(ours, value), f"{rel}: {key} is declared a deviation but equals the official {value!r}"
        else:
            assert same(ours, value), f"{rel}: {key} = {ours!r}, official {value!r} ({entry['source']})"
    for key, _ in leaves(yaml.safe_load(text)):
        assert key in official or key in deviations or key in NOT_OFFICIAL, f"{rel}: {key} has no official value"


def test_a_drifted_recipe_fails():
    """The comparison can fail: an edit of one official field is caught."""
    rel = "cifar100/dkd/resnet32x4_resnet8x4.yaml"
    cfg = load_config(CONFIGS / rel)
    drifted = dataclasses.replace(cfg, method=dataclasses.replace(cfg.method, beta=cfg.method.beta + 1))
    assert not same(effective(drifted, "method.beta"), OFFICIAL[rel]["official"]["method.beta"])
    assert same(effective(cfg, "method.beta"), OFFICIAL[rel]["official"]["method.beta"])
