"""Recipes: the committed configs are the generator's output, all load, and each Fashion-MNIST recipe
trains through the real CLI (on digits, with a tiny mlp) with pinned first losses."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest
import yaml

from kdcollapse.cli import main
from kdcollapse.config import load_config

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
AREAS = ("cifar100", "imagenet", "fashion_mnist", "fashion_mnist_pairs")
HAND_WRITTEN = {Path("fashion_mnist/teacher.yaml"), Path("fashion_mnist_pairs/teacher.yaml")}


def generator():
    spec = importlib.util.spec_from_file_location("generate_recipes", CONFIGS / "generate.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


GENERATED = generator().recipes()


def test_committed_recipes_are_the_generator_output():
    committed = {p.relative_to(CONFIGS) for area in AREAS for p in (CONFIGS / area).rglob("*.yaml")}
    assert committed - HAND_WRITTEN == set(GENERATED), "run python configs/generate.py"
    stale = [str(rel) for rel, text in GENERATED.items() if (CONFIGS / rel).read_text() != text]
    assert not stale, f"out of date, run python configs/generate.py: {stale}"
    assert generator().main(["--check"]) == 0


def test_regenerate_checks_without_writing_and_writes_only_what_differs(tmp_path, capsys):
    """The generators' one command line (kdcollapse.recipes.regenerate): --check names a stale or missing file,
    returns 1 and writes nothing; a plain run writes those (folders included) and leaves the others alone."""
    from kdcollapse.recipes import regenerate

    same, stale, missing = tmp_path / "same.yaml", tmp_path / "stale.yaml", tmp_path / "new" / "missing.yaml"
    same.write_text("a: 1\n")
    stale.write_text("b: 0\n")
    files = {same: "a: 1\n", stale: "b: 2\n", missing: "c: 3\n"}
    before = same.stat().st_mtime_ns
    assert regenerate(files, ["--check"], "doc", "configs/generate.py") == 1
    out = capsys.readouterr().out
    assert "run python configs/generate.py" in out and "stale.yaml" in out and "missing.yaml" in out
    assert "same.yaml" not in out and stale.read_text() == "b: 0\n" and not missing.parent.exists()
    assert regenerate(files, [], "doc", "configs/generate.py") == 0
    assert all(path.read_text() == text for path, text in files.items()) and same.stat().st_mtime_ns == before
    assert regenerate(files, ["--check"], "doc", "configs/generate.py") == 0


def test_recipe_set_is_complete():
    for method in ("kd", "dkd", "dhkd", "ikl_kd", "fitnet", "ofd"):
        assert len([p for p in GENERATED if p.parts[:2] == ("cifar100", method)]) == 11  # DHKD Tables 1-2
    for method in ("kd", "dkd", "dhkd", "ikl_kd", "at", "ofd", "dist"):
        assert len([p for p in GENERATED if p.parts[:2] == ("imagenet", method)]) == 2  # DHKD Tables 3-4
    assert len([p for p in GENERATED if p.parts[:2] == ("cifar100", "dist")]) == 6  # the DIST authors' table
    assert Path("cifar100/at/resnet32x4_resnet8x4.yaml") in GENERATED
    assert len([p for p in GENERATED if p.parts[:2] == ("cifar100", "teachers")]) == 6


@pytest.mark.parametrize("rel", sorted(map(str, [*GENERATED, *HAND_WRITTEN])))
def test_every_recipe_loads(rel):
    cfg = load_config(CONFIGS / rel)
    text = (CONFIGS / rel).read_text()
    if rel.startswith(("cifar100", "imagenet")) and "teachers" not in rel:
        assert text.startswith("# Reproduces: "), rel  # names the paper number it should reproduce
        teacher_dir = Path(cfg.teacher.checkpoint)
        teacher_recipe = CONFIGS / rel.split("/")[0] / "teachers" / f"{teacher_dir.name.removeprefix('teacher_')}.yaml"
        assert load_config(teacher_recipe).run_dir == cfg.teacher.checkpoint  # a recipe trains that teacher
        assert load_config(teacher_recipe).data.name == cfg.data.name


def test_official_hyperparameters_spot_checks():
    def method(rel):
        return yaml.safe_load((CONFIGS / rel).read_text())["method"]

    assert method("cifar100/dhkd/resnet56_resnet20.yaml") == {
        "name": "dhkd", "alpha": 0.1, "temperature": 2.0, "ce_weight": 1.0, "aux_head": "linear",
        "alignment": "global"}
    assert method("cifar100/dhkd/vgg13_mobilenetv2.yaml")["aux_head"] == "mlp"
    assert load_config(CONFIGS / "cifar100/dhkd/vgg13_mobilenetv2.yaml").optim.lr == 0.01
    assert method("cifar100/dkd/wrn_40_2_wrn_16_2.yaml")["beta"] == 6.0
    assert method("cifar100/ikl_kd/resnet32x4_shufflev2.yaml") | {} == {
        "name": "ikl_kd", "mse_weight": 12.0, "soft_ce_weight": 3.0, "temperature": 4.0,
        "weight_temperature": 100.0, "ce_weight": 1.0, "warmup_epochs": 20}
    assert method("imagenet/dhkd/resnet34_resnet18.yaml")["distill_until"] == 50
    assert method("imagenet/ikl_kd/resnet50_mobilenetv1.yaml")["soft_ce_weight"] == 4.0
    assert method("cifar100/fitnet/resnet32x4_resnet8x4.yaml") == {
        "name": "fitnet", "ce_weight": 1.0, "hint_weight": 100.0, "student_stage": 2, "teacher_stage": 2}
    assert method("cifar100/ofd/vgg13_vgg8.yaml")["teacher_stages"] == [1, 2, 3, 4]
    assert method("imagenet/ofd/resnet50_mobilenetv1.yaml") | {} == {
        "name": "ofd", "ce_weight": 1.0, "feat_weight": 1e-4, "student_stages": [3, 4, 5], "teacher_stages": [2, 3, 4]}
    assert method("imagenet/dist/resnet34_resnet18.yaml")["temperature"] == 1.0
    assert method("cifar100/dist/resnet32x4_shufflev2.yaml")["temperature"] == 4.0


# First two training losses (one step per epoch) of each Fashion-MNIST recipe on 30 digits images;
# deterministic given the seed (single-threaded). Change them only for an intended change of the maths.
PINNED = {
    "student": [2.312654733657837, 2.354353666305542],
    "kd": [0.3007622957229614, 0.29050642251968384],
    "dkd": [2.6486012935638428, 2.75712513923645],
    "dhkd": [2.504462957382202, 2.476074457168579],
    "ikl_kd": [3.792548418045044, 5.067569732666016],
    "dual_head_kd": [2.4069325923919678, 2.4118733406066895],
    "ce_binarykl": [2.55800461769104, 2.5004162788391113],
    "binarykl_only": [0.21077974140644073, 0.14054988324642181],
    "dist": [69.51753997802734, 90.26846313476562],
    "pkt": [13.593820571899414, 24.2440242767334],
    "fitnet": [46.3981819152832, 15.170525550842285],
    "at": [63.268310546875, 67.45654296875],
    "ofd": [2.9421963691711426, 2.840733051300049],
    "nst": [6.8994035720825195, 13.369685173034668],
    "sp": [18.584468841552734, 38.42279815673828],
}


STAGE_MAPS = {"fitnet", "at", "ofd", "nst", "sp"}  # read stage maps: convnet_small student and teacher


@pytest.mark.parametrize("stem", sorted(PINNED))
def test_fashion_mnist_recipe_trains_with_pinned_losses(stem, tmp_path, request):
    recipe = CONFIGS / "fashion_mnist" / f"{stem}.yaml"
    command = "train" if stem == "student" else "distill"
    model = (["model.name=convnet_small", "model.kwargs={}"] if stem in STAGE_MAPS else
             ["model.name=mlp", "model.kwargs={input_size: 8, hidden: [16]}"])
    overrides = ["data.name=digits", "data.train_per_class=3", "data.batch_size=30", "data.test_per_class=2",
                 *model, "schedule.warmup_epochs=0",
                 "train.epochs=2", "train.progress=false", f"run_dir={tmp_path / stem}"]
    if command == "distill":
        teacher = request.getfixturevalue("digits_conv_teacher" if stem in STAGE_MAPS else "digits_teacher")
        overrides.append(f"teacher.checkpoint={teacher}")
    assert main([command, "--config", str(recipe), *overrides]) == 0
    records = [json.loads(line) for line in (tmp_path / stem / "metrics.jsonl").read_text().splitlines()]
    losses = [r["train_loss"] for r in records]
    assert losses == pytest.approx(PINNED[stem], rel=1e-5)


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz").exists(),
                    reason="Fashion-MNIST not in /usr/share/datasets/fashion-mnist")
def test_fashion_mnist_pairs_teacher_and_dhkd_recipes_run_on_the_real_pairs(tmp_path):
    tiny = ["data.train_per_class=2", "data.test_per_class=1", "model.name=mlp",
            "model.kwargs={input_size: [28, 56], hidden: [16]}", "train.epochs=1", "train.progress=false"]
    area = CONFIGS / "fashion_mnist_pairs"
    assert main(["train", "--config", str(area / "teacher.yaml"), *tiny, f"run_dir={tmp_path / 't'}"]) == 0
    assert main(["distill", "--config", str(area / "dhkd.yaml"), *tiny, f"run_dir={tmp_path / 's'}",
                 f"teacher.checkpoint={tmp_path / 't'}", "method.binary_kl_form=official"]) == 0
    (record,) = [json.loads(line) for line in (tmp_path / "s" / "metrics.jsonl").read_text().splitlines()]
    assert record["selected_on"] == "val" and {"val_acc", "test_acc", "train_binary_kl_norm"} <= record.keys()


def test_the_k100_feature_recipes_are_the_k10_ones_on_the_pairs_task():
    """Each feature method of the K = 10 method table has a fashion_mnist_pairs recipe with the same method block,
    student, optimiser and schedule; only the task (data, run and teacher directories) differs."""
    stems = ("fitnet", "at", "ofd", "dist", "nst", "sp", "pkt", "crd", "reviewkd", "vid")
    for stem in stems:
        k10, k100 = (load_config(CONFIGS / area / f"{stem}.yaml") for area in ("fashion_mnist", "fashion_mnist_pairs"))
        assert k100.data.name == "fashion_mnist_pairs" and k100.model == k10.model, stem
        assert (k100.method, k100.optim, k100.schedule, k100.train) == (k10.method, k10.optim, k10.schedule, k10.train)
        assert k100.data == load_config(CONFIGS / "fashion_mnist_pairs/kd.yaml").data, stem
