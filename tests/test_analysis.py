"""Collapse analysis: `analyze` against a plain feature loop, the per-epoch hook against `analyze`, the DHKD
App. H logit matrices against numpy, the bounded sample against brute force, `plot`, and bad input."""

import json

import numpy as np
import pytest
import torch

from kdcollapse.analysis import (
    ClassLogitMatrix,
    ClassReservoir,
    EPOCH_KEYS,
    logit_margins,
    logit_matrix_difference,
    tsne,
)
from kdcollapse.cli import main
from kdcollapse.config import load_config
from kdcollapse.data import make_loader
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.metrics import ncc_accuracy
from kdcollapse.metrics.functional import collapse_metrics_from_features
from kdcollapse.train import fit
from kdcollapse.runs import load_model, load_tensors, read_metrics, run_dataset

# How these runs differ from the tiny run (conftest.py): every digit, a wider hidden layer.
RUN = ["data.batch_size=64", "data.eval_batch_size=100", "data.train_per_class=null", "data.test_per_class=null",
       "model.kwargs={input_size: 8, hidden: [32]}"]
PER_CLASS = 40  # analysis.train_per_class of the tiny run


@pytest.fixture(scope="module")
def run(tmp_path_factory, tiny_config):
    """Two epochs of an MLP on digits with collapse metrics every epoch."""
    path = tmp_path_factory.mktemp("analysis") / "run"
    fit(tiny_config(path, *RUN, "train.epochs=2", "analysis.every=1", f"analysis.train_per_class={PER_CLASS}"))
    return path


@pytest.fixture(scope="module")
def dual_head_run(tmp_path_factory, tiny_config, run):
    """A DHKD student (linear auxiliary head) distilled from `run` as its teacher."""
    path = tmp_path_factory.mktemp("analysis") / "dual"
    fit(tiny_config(path, *RUN, "train.epochs=1", "method.name=dhkd", f"teacher.checkpoint={run}"))
    return path


def plain_features(model, dataset, batch_size=37):
    """Features, logits and labels of a whole split by the simplest loop (another batch size on purpose)."""
    model.eval()
    features, logits, labels = [], [], []
    with torch.no_grad():
        for x, y in make_loader(dataset, batch_size, train=False, device="cpu", seed=0):
            h = model.forward_features(x)
            features.append(h)
            logits.append(model.forward_head(h))
            labels.append(y)
    return torch.cat(features), torch.cat(logits), torch.cat(labels)


def analyze_cli(*args):
    assert main(["analyze", *map(str, args), "--no-progress"]) == 0


def test_analyze_writes_report_equal_to_a_plain_feature_loop(run, tmp_path):
    out = tmp_path / "test"
    analyze_cli(run, "--split", "test", "--out", out, "--tsne-per-class", 10)
    for name in ("analysis.json", "analysis.md", "spectra.png", "margins.png", "tsne.png"):
        assert (out / name).stat().st_size > 0, name
    report = json.loads((out / "analysis.json").read_text())
    assert not (out / "logit_matrices.png").exists() and report["logit_matrices"] == {}  # no teacher

    model, _ = load_model(run / "model.safetensors")
    dataset = run_dataset(load_config(run / "config.yaml"), "test")
    h, z, y = plain_features(model, dataset)
    expected = collapse_metrics_from_features(h, y, 10, model.head.weight)
    metrics = report["metrics"]
    assert report["num_samples"] == len(dataset) == 355
    for key, value in expected.items():
        assert metrics[key] == pytest.approx(float(value), rel=1e-6, abs=1e-9), key
    ncc = ncc_accuracy(h, y, h.double().new_tensor(
        np.stack([h[y == k].double().mean(0).numpy() for k in range(10)])), z)
    assert metrics["ncc_exact"] is True and metrics["ncc_samples"] == 355
    assert metrics["ncc_accuracy"] == pytest.approx(float(ncc["ncc_accuracy"]), abs=1e-6)
    assert metrics["ncc_agreement"] == pytest.approx(float(ncc["ncc_agreement"]), abs=1e-6)
    assert metrics["accuracy"] == pytest.approx(float((z.argmax(1) == y).double().mean()))
    margins = torch.tensor([z[i, y[i]] - torch.cat([z[i, :y[i]], z[i, y[i] + 1:]]).max() for i in range(len(y))])
    assert report["margins"]["all"]["mean"] == pytest.approx(float(margins.double().mean()), rel=1e-6)
    assert report["margins"]["all"]["negative"] == pytest.approx(float((margins < 0).double().mean()))
    h64 = h.double()
    means = torch.stack([h64[y == k].mean(0) for k in range(10)])
    centred = means - h64.mean(0)
    prior = torch.bincount(y, minlength=10).double() / len(y)
    covariances = {"total": torch.cov(h64.T, correction=0), "between": (centred.T * prior) @ centred,
                   "within": torch.cov((h64 - means[y]).T, correction=0)}
    for name, sigma in covariances.items():  # VCI paper Sec. 4.3 spectra, largest first
        assert report["spectra"][name] == pytest.approx(torch.linalg.eigvalsh(sigma).flip(0).tolist(), abs=1e-8)
    text = (out / "analysis.md").read_text()
    assert "| vci |" in text and "linear probe" in text and "![tsne](tsne.png)" in text
    # the t-SNE is kept: each point's row of the split, its label and coordinates, equal to t-SNE of those rows'
    # features by the plain loop (at analyze's batch size: the same float32 features)
    embedded = report["tsne"]
    index = torch.tensor(embedded["index"])
    assert embedded["points"] == len(index) == 100 and len(set(embedded["index"])) == 100
    assert embedded["labels"] == y[index].tolist() and embedded["class_names"] == dataset.classes
    assert torch.bincount(y[index], minlength=10).tolist() == [10] * 10
    h_eval, _, _ = plain_features(model, dataset, batch_size=100)  # data.eval_batch_size of these runs
    expected = tsne(h_eval[index].numpy(), load_config(run / "config.yaml").seed)
    assert np.array(embedded["embedding"]) == pytest.approx(expected, abs=6e-4)  # rounded to 0.001


def test_epoch_metrics_are_logged_and_equal_offline_analysis_of_the_last_checkpoint(run, tmp_path):
    records = read_metrics(run)
    assert [r["epoch"] for r in records] == [1, 2]
    for record in records:
        for split in ("train", "test"):
            for key in EPOCH_KEYS:
                assert np.isfinite(record[f"{split}_{key}"]), (split, key)
        assert record["gnc2"] > 0 and record["analysis_time_s"] > 0
    last = records[-1]
    for split, extra in (("train", ["--per-class", PER_CLASS]), ("test", [])):
        analyze_cli(run, "--split", split, "--out", tmp_path / split, "--tsne-per-class", 0, *extra)
        metrics = json.loads((tmp_path / split / "analysis.json").read_text())["metrics"]
        assert json.loads((tmp_path / split / "analysis.json").read_text())["num_samples"] == (
            10 * PER_CLASS if split == "train" else 355)
        for key in EPOCH_KEYS:
            assert last[f"{split}_{key}"] == pytest.approx(metrics[key], rel=1e-9, abs=1e-12), (split, key)
    assert last["gnc2"] == pytest.approx(metrics["gnc2"], rel=1e-12)
    assert records[0]["train_nc1"] != last["train_nc1"]  # the epochs really differ


def test_epoch_metrics_do_not_change_training(run, tmp_path, tiny_config):
    plain = fit(tiny_config(tmp_path / "plain", *RUN, "train.epochs=2"))
    a = load_tensors(run / "checkpoint.safetensors")[0]
    b = load_tensors(plain.run_dir / "checkpoint.safetensors")[0]
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert "train_nc1" not in read_metrics(plain.run_dir)[-1]


def numpy_logit_matrix(teacher_logits, student_logits, labels, k):
    """M^t - M^s of DHKD App. H by the definition: per true class, the mean of the teacher's logits minus
    the mean of the student's."""
    t, s, y = (np.asarray(a, dtype=np.float64) for a in (teacher_logits, student_logits, labels))
    return np.stack([t[y == c].mean(0) - s[y == c].mean(0) for c in range(k)])


def test_logit_matrix_difference_matches_numpy_and_streams():
    g = torch.Generator().manual_seed(1)
    k, n = 5, 203
    labels = torch.arange(n) % k
    teacher, student = torch.randn(n, k, generator=g) * 4, torch.randn(n, k, generator=g) * 4 + 1
    expected = numpy_logit_matrix(teacher, student, labels, k)
    np.testing.assert_allclose(logit_matrix_difference(teacher, student, labels, k).numpy(), expected, atol=1e-6)
    streamed = ClassLogitMatrix(k)
    for part in torch.arange(n).split(17):
        streamed.update(teacher[part].double() - student[part].double(), labels[part])
    np.testing.assert_allclose(streamed.compute().numpy(), expected, atol=1e-6)
    with pytest.raises(KdcollapseError, match=r"classes \[4\] have no samples"):
        logit_matrix_difference(teacher[:4], student[:4], labels[:4], k)
    with pytest.raises(KdcollapseError, match="differ in shape"):
        logit_matrix_difference(teacher, student[:, :4], labels, k)


def test_dual_head_run_reports_both_heads_against_its_teacher(run, dual_head_run, tmp_path):
    analyze_cli(dual_head_run, "--split", "test", "--out", tmp_path, "--tsne-per-class", 0)
    report = json.loads((tmp_path / "analysis.json").read_text())
    assert set(report["logit_matrices"]) == {"main", "aux"} and (tmp_path / "logit_matrices.png").exists()
    assert report["teacher"] == str(run)

    student, _ = load_model(dual_head_run / "model.safetensors")
    teacher, _ = load_model(run / "model.safetensors")
    state = load_tensors(dual_head_run / "checkpoint.safetensors")[0]
    aux = torch.nn.Linear(student.feature_dim, 10)
    aux.load_state_dict({"weight": state["method.aux_head.weight"], "bias": state["method.aux_head.bias"]})
    dataset = run_dataset(load_config(dual_head_run / "config.yaml"), "test")
    h, z, y = plain_features(student, dataset)
    z_teacher = plain_features(teacher, dataset)[1]
    with torch.no_grad():
        z_aux = aux(h)
    for name, logits in (("main", z), ("aux", z_aux)):
        expected = numpy_logit_matrix(z_teacher, logits, y, 10)
        np.testing.assert_allclose(report["logit_matrices"][name]["matrix"], expected, atol=1e-5)
        off = ~np.eye(10, dtype=bool)
        assert report["logit_matrices"][name]["mean_abs_off_diagonal"] == pytest.approx(
            np.abs(expected[off]).mean(), abs=1e-5)
    assert report["metrics"]["accuracy_aux"] == pytest.approx(float((z_aux.argmax(1) == y).double().mean()))
    assert "aux" in (tmp_path / "analysis.md").read_text()


def test_teacher_option_gives_a_vanilla_run_logit_matrices(run, dual_head_run, tmp_path):
    analyze_cli(run, "--teacher", dual_head_run, "--out", tmp_path, "--tsne-per-class", 0)
    report = json.loads((tmp_path / "analysis.json").read_text())
    assert set(report["logit_matrices"]) == {"main"} and "tsne" not in report["figures"]


def test_logit_margins_match_a_loop():
    logits = torch.tensor([[3.0, 1.0, 2.0], [0.0, 5.0, 5.0], [1.0, 4.0, -2.0]])
    labels = torch.tensor([0, 2, 0])
    assert logit_margins(logits, labels).tolist() == [1.0, 0.0, -3.0]


@pytest.mark.parametrize("sizes", [[7, 100, 1, 300, 592], [1000]])
def test_reservoir_keeps_the_smallest_keys_of_every_class(sizes):
    g = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 4, (1000,), generator=g)
    sample = ClassReservoir(4, per_class=20, seed=5)
    start = 0
    for b in sizes:
        index = torch.arange(start, start + b)
        sample.update(labels[start:start + b], index=index, twice=2 * index)
        start += b
    keys_generator = torch.Generator().manual_seed(5)
    keys = torch.cat([torch.rand(b, generator=keys_generator) for b in sizes])
    expected = []
    for c in range(4):
        members = (labels == c).nonzero().flatten()
        expected += members[keys[members].argsort()[:20]].tolist()
    assert sample.columns["index"].tolist() == expected
    assert torch.equal(sample.columns["twice"], 2 * sample.columns["index"])
    assert sample.labels.tolist() == sorted(labels[expected].tolist()) and not sample.exact
    assert sample.count.tolist() == torch.bincount(labels, minlength=4).tolist()
    first = sample.first(3, classes=[1, 3])
    assert sample.labels[first].tolist() == [1, 1, 1, 3, 3, 3]
    assert sample.columns["index"][first].tolist() == expected[20:23] + expected[60:63]


def test_reservoir_is_exact_when_classes_fit():
    sample = ClassReservoir(3, per_class=10, seed=0)
    labels = torch.tensor([2, 0, 1, 0, 2, 2])
    sample.update(labels, index=torch.arange(6))
    assert sample.exact and sorted(sample.columns["index"].tolist()) == list(range(6))
    with pytest.raises(KdcollapseError, match="differ from the first batch"):
        sample.update(labels, other=torch.arange(6))


def test_vector_data_run(tmp_path):
    """gaussian_mixture: float32 vectors instead of uint8 images."""
    cfg = load_config(None, ["data.name=gaussian_mixture", "train.progress=false", "model.name=mlp",
                             "model.kwargs={input_size: 1, hidden: [16]}", "train.epochs=1", "analysis.every=1",
                             f"run_dir={tmp_path / 'g'}", "data.batch_size=100", "schedule.name=constant"])
    fit(cfg)
    assert read_metrics(tmp_path / "g")[-1]["test_vci"] >= 0
    analyze_cli(tmp_path / "g", "--out", tmp_path / "a", "--tsne-classes", "0,1,2", "--tsne-per-class", 20)
    report = json.loads((tmp_path / "a" / "analysis.json").read_text())
    assert report["feature_dim"] == 16 and report["tsne"]["classes"] == [0, 1, 2] and report["tsne"]["points"] == 60
    assert sorted(report["tsne"]["labels"]) == [0] * 20 + [1] * 20 + [2] * 20 and len(report["tsne"]["embedding"]) == 60


def test_weights_file_mode_and_model_mismatch(run, tmp_path, capsys):
    weights = run / "model.safetensors"
    analyze_cli("--model", "mlp", "--weights", weights, "--data", "digits", "--out", tmp_path / "w",
                "--tsne-per-class", 0)
    assert json.loads((tmp_path / "w" / "analysis.json").read_text())["num_samples"] == 355
    assert main(["analyze", "--model", "convnet_small", "--weights", str(weights), "--data", "digits",
                 "--out", str(tmp_path / "x")]) == 2
    assert "holds a 'mlp', not a 'convnet_small'" in capsys.readouterr().err
    bare = tmp_path / "bare.safetensors"
    from safetensors.torch import save_file

    save_file(load_tensors(weights)[0], bare)
    args = ["analyze", "--model", "mlp", "--weights", str(bare), "--data", "digits", "--out", str(tmp_path / "y")]
    assert main(args) == 2  # built for 28x28 inputs: the weights do not fit
    assert "do not fit MLP" in capsys.readouterr().err
    assert main([*args, "--model-kwargs", "{input_size: 8, hidden: [32]}", "--tsne-per-class", "0",
                 "--no-progress"]) == 0


def test_bad_input_errors(run, tmp_path, capsys, tiny_config):
    cases = [
        (["analyze", str(tmp_path / "missing")], "run directory not found"),
        (["analyze", str(run), "--split", "dev"], "unknown split 'dev'. Valid choices: test, train, val"),
        (["analyze", str(run), "--split", "val"], "this run has no validation split"),
        (["analyze", str(tmp_path)], "holds no config.yaml"),
        (["analyze", str(run), "--model", "mlp"], "either RUN_DIR or --model"),
        (["analyze", "--model", "mlp"], "give a RUN_DIR, or all of"),
        (["analyze", str(run), "--tsne-classes", "0,12"], "t-SNE classes must be indices in 0..9"),
        (["analyze", str(run), "--per-class", "1000"], "cannot take 1000 samples per class"),
        (["plot", str(tmp_path / "missing")], "run directory not found"),
        (["plot", str(run), "--keys", "test_acc,test_vic"], "test_vic"),
        (["plot", str(run), "--labels", "a,b"], "2 labels for 1 runs"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err, argv
    with pytest.raises(ConfigError, match="analysis.every must be >= 0"):
        tiny_config(tmp_path / "r", "analysis.every=-1")


def test_plot_command_draws_several_runs(run, dual_head_run, tmp_path, capsys):
    out = tmp_path / "curves.png"
    assert main(["plot", str(run), str(dual_head_run), "--keys", "test_acc,train_vci,test_nc1,gnc2",
                 "--labels", "vanilla,dual", "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "2 run(s), 4 panel(s)" in capsys.readouterr().out
    assert main(["plot", str(run), "--out", str(tmp_path / "default.png")]) == 0
    assert "6 panel(s)" in capsys.readouterr().out  # test_acc, train_loss and the nc1/vci keys it logs


@pytest.mark.slow
def test_epoch_metrics_under_torchrun_come_from_rank_0(tmp_path, tiny_overrides):
    """Two gloo processes (torchrun's environment, tests/ranks.py): rank 0 measures alone while rank 1 waits;
    the run finishes, both epochs carry the keys, and the last equals an offline analysis of the saved model."""
    from ranks import run_ranks

    (tmp_path / "empty.yaml").write_text("{}\n")
    proc = run_ranks(["train", "--config", str(tmp_path / "empty.yaml"), *tiny_overrides, *RUN, "data.batch_size=32",
                      "train.epochs=2", "analysis.every=1", f"analysis.train_per_class={PER_CLASS}",
                      f"run_dir={tmp_path / 'ddp'}"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = read_metrics(tmp_path / "ddp")
    assert [r["epoch"] for r in records] == [1, 2] and all(r["ranks_in_sync"] for r in records)
    analyze_cli(tmp_path / "ddp", "--out", tmp_path / "a", "--tsne-per-class", 0)
    metrics = json.loads((tmp_path / "a" / "analysis.json").read_text())["metrics"]
    for key in EPOCH_KEYS:
        assert records[-1][f"test_{key}"] == pytest.approx(metrics[key], rel=1e-9, abs=1e-12), key
