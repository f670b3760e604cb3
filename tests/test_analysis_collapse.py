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
