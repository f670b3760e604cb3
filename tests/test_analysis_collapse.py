"""``kdcollapse analyze``'s further collapse inputs: NC5 against an out-of-distribution data set (``--ood``),
equal to the metric of a plain feature loop; bad input."""

import json

import pytest
import torch

from kdcollapse.cli import main
from kdcollapse.config import load_config
from kdcollapse.data import load_dataset, make_loader
from kdcollapse.metrics import FeatureStatistics, collapse_metrics
from kdcollapse.runs import load_model, run_dataset
from kdcollapse.train import fit


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_config):
    path = tmp_path_factory.mktemp("collapse") / "run"
    fit(tiny_config(path, "train.epochs=1"))
    return path


def features_of(model, dataset):
    model.eval()
    with torch.no_grad():
        pairs = [(model.forward_features(x), y) for x, y in make_loader(dataset, 41, train=False, device="cpu", seed=0)]
    return torch.cat([h for h, _ in pairs]), torch.cat([y for _, y in pairs])


def test_ood_gives_nc5_of_the_plain_feature_loop(run, tmp_path):
    out = tmp_path / "a"
    assert main(["analyze", str(run), "--out", str(out), "--ood", "digits", "--ood-split", "train",
                 "--ood-classes", "3,7", "--no-progress"]) == 0
    report = json.loads((out / "analysis.json").read_text())
    model, _ = load_model(run / "model.safetensors")
    h, y = features_of(model, run_dataset(load_config(run / "config.yaml"), "test"))
    ood_h, _ = features_of(model, load_dataset("digits", "train").select_classes([3, 7]))
    stats = FeatureStatistics(10, h.shape[1])
    stats.update(h, y)
    expected = collapse_metrics(stats, ood_mean=ood_h.double().mean(0))["nc5_ood_deviation"]
    assert report["metrics"]["nc5_ood_deviation"] == pytest.approx(float(expected), rel=1e-6)
    assert report["ood"] == {"dataset": "digits", "samples": len(ood_h)}
    assert "nc5_ood_deviation" in (out / "analysis.md").read_text()


@pytest.mark.parametrize("args, message", [
    (["--ood-classes", "1,2"], "--ood-classes needs --ood NAME"),
    (["--ood", "fashion_mnist"], "inputs of shape"),
    (["--ood", "no_such_data"], "no_such_data"),
])
def test_bad_ood_input_is_one_error_line(run, tmp_path, capsys, args, message):
    out = tmp_path / "bad"
    assert main(["analyze", str(run), "--out", str(out), "--no-progress", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and message in err
    assert not out.exists()


# ------------------------------------------------------------------------------------------- --against
CONV = ["model.name=convnet_small", "model.kwargs={}"]


@pytest.fixture(scope="module")
def conv_teacher(tmp_path_factory, tiny_config):
    path = tmp_path_factory.mktemp("collapse") / "teacher"
    fit(tiny_config(path, *CONV, "train.epochs=1"))
    return path


@pytest.fixture(scope="module")
def conv_student(tmp_path_factory, tiny_config, conv_teacher):
    path = tmp_path_factory.mktemp("collapse") / "student"
    fit(tiny_config(path, *CONV, "train.epochs=1", "method.name=kd", f"teacher.checkpoint={conv_teacher}"))
    return path


def test_against_equals_the_geometry_of_two_plain_feature_loops(conv_student, conv_teacher, tmp_path):
    from kdcollapse.metrics import PairedFeatures, geometry_alignment

    out = tmp_path / "against"
    assert main(["analyze", str(conv_student), "--against", str(conv_teacher), "--out", str(out), "--stages", "all",
                 "--no-progress"]) == 0
    report = json.loads((out / "against.json").read_text())
    dataset = run_dataset(load_config(conv_student / "config.yaml"), "test")
    models = [load_model(run / "model.safetensors")[0] for run in (conv_student, conv_teacher)]
    (hs, y), (ht, _) = (features_of(m, dataset) for m in models)
    stats = [FeatureStatistics(10, h.shape[1]) for h in (hs, ht)]
    paired = PairedFeatures(hs.shape[1], ht.shape[1])
    for s, h in zip(stats, (hs, ht)):
        s.update(h, y)
    paired.update(hs, ht)
    expected = geometry_alignment(*stats, models[0].head.weight, models[1].head.weight, paired)
    for key, value in expected.items():
        assert report["layers"]["features"][key] == pytest.approx(float(value), rel=1e-5, abs=1e-7), key
    assert set(report["layers"]) == {"features", "stage0/stage0", "stage1/stage1", "stage2/stage2", "stage3/stage3"}
    assert 0 <= report["agreement"] <= 1 and len(report["agreement_per_class"]) == 10
    assert "procrustes_alignment" in (out / "against.md").read_text()
    # a stage: the spatial mean of each model's stage-2 map over the same samples
    maps = []
    for m in models:
        m.eval()
        with torch.no_grad():
            maps.append(torch.cat([m.forward_intermediates(x, [2])[1][0].mean((2, 3))
                                   for x, _ in make_loader(dataset, 41, train=False, device="cpu", seed=0)]))
    stage = PairedFeatures(maps[0].shape[1], maps[1].shape[1])
    stage.update(*maps)
    assert report["layers"]["stage2/stage2"]["feature_cka"] == pytest.approx(
        float(stage.compute()["feature_cka"]), rel=1e-5)


def test_a_model_against_itself_is_aligned_at_every_stage(conv_teacher, tmp_path):
    out = tmp_path / "self"
    assert main(["analyze", str(conv_teacher), "--against", str(conv_teacher), "--out", str(out), "--stages", "1,3",
                 "--no-progress"]) == 0
    report = json.loads((out / "against.json").read_text())
    assert set(report["layers"]) == {"features", "stage1/stage1", "stage3/stage3"}
    for name, layer in report["layers"].items():
        for key in ("procrustes_alignment", "simplex_similarity", "feature_cka", "feature_cka_unbiased"):
            assert layer[key] == pytest.approx(1.0, abs=1e-6), (name, key)
        assert layer["procrustes_residual"] == pytest.approx(0.0, abs=1e-6)
    assert report["agreement"] == 1.0


# ------------------------------------------------------------------------------------------- --stages
def test_stages_give_every_metric_of_each_pooled_stage_map_from_the_same_pass(conv_teacher, tmp_path):
    out = tmp_path / "stages"
    assert main(["analyze", str(conv_teacher), "--out", str(out), "--stages", "all", "--no-progress"]) == 0
    report = json.loads((out / "analysis.json").read_text())
    assert list(report["stages"]) == ["stage0", "stage1", "stage2", "stage3"]
    model, _ = load_model(conv_teacher / "model.safetensors")
    dataset = run_dataset(load_config(conv_teacher / "config.yaml"), "test")
    model.eval()
    with torch.no_grad():
        pairs = [(model.forward_intermediates(x)[1], y) for x, y in make_loader(dataset, 41, train=False,
                                                                                device="cpu", seed=0)]
    y = torch.cat([y for _, y in pairs])
    for index, name in enumerate(report["stages"]):
        pooled = torch.cat([maps[index].mean((2, 3)) for maps, _ in pairs])
        stats = FeatureStatistics(10, pooled.shape[1])
        stats.update(pooled, y)
        expected = collapse_metrics(stats)
        assert report["stages"][name]["channels"] == pooled.shape[1]
        for key in ("nc1", "vci", "nc2_etf_error", "nc2g_log_var", "cdnv"):
            assert report["stages"][name][key] == pytest.approx(float(expected[key]), rel=1e-5), (name, key)
    assert (out / "stages.png").stat().st_size > 0
    assert "## Stage by stage" in (out / "analysis.md").read_text()


def test_stages_of_a_model_without_stage_maps_is_an_error(run, tmp_path, capsys):
    assert main(["analyze", str(run), "--out", str(tmp_path / "x"), "--stages", "all", "--no-progress"]) == 2
    assert "no stage outputs" in capsys.readouterr().err
    assert main(["analyze", str(run), "--out", str(tmp_path / "x"), "--stages", "one", "--no-progress"]) == 2
    assert "--stages must be 'all'" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
