"""The `spherical` method: GNC heads (cosine, CMF, fixed code) trained through the trainer, checkpointed,
resumed and rebuilt by load_model; class selection of datasets; the MLP bottleneck."""

from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from kdcollapse.config import load_config, method_config
from kdcollapse.data import Augment, FolderDataset, load_dataset, make_loader
from kdcollapse.errors import ConfigError, DataError, KdcollapseError
from kdcollapse.geometry import closed_form_code
from kdcollapse.models.heads import ClassMeanFeatureHead, CosineHead, FixedHead
from kdcollapse.methods import build_method
from kdcollapse.models import create_model
from kdcollapse.train import fit
from kdcollapse.runs import load_model, load_tensors, read_metrics, save_tensors
from kdcollapse.train._trainer import seed_everything
from naming import raises_naming

# digits (K = 10), 12 images per class = 120 in 2 batches of 60: every epoch is exactly two steps.
# The feature is a linear bottleneck of d = 5, so K = 2d: the softmax code is the cross-polytope (Thm 3.3).
K, D = 10, 5
KWARGS = {"input_size": 8, "hidden": [32], "bottleneck": D}
# How these runs differ from the tiny run (conftest.py).
RUN = ["data.batch_size=60", "data.train_per_class=12", "data.test_per_class=null", f"model.kwargs={KWARGS}",
       "method.name=spherical"]
ASSIGNMENT = [3, 1, 4, 0, 5, 9, 2, 6, 8, 7]
HEADS = {
    "linear": ["method.head=linear"],
    "cosine": ["method.head=cosine", "method.temperature=0.2"],
    "cmf": ["method.head=cmf", "method.beta=0.8"],
    "fixed": ["method.head=fixed", "method.code=softmax", f"method.assignment={ASSIGNMENT}"],
}
# The loss of the first step; each is also checked against the definition below. Pinned so that any
# change of initialisation, data order or head formula shows.
FIRST_LOSS = {"linear": 2.3579743, "cosine": 3.8220296, "cmf": 6.4060016, "fixed": 7.5462079}


@pytest.fixture(scope="module")
def config(tiny_config):
    """``config(root, head, *overrides, name=head)``: a spherical run with that head, in ``root / name``."""
    return lambda root, head, *extra, name=None: tiny_config(root / (name or head), *RUN, *HEADS[head], *extra)


def replay(cfg):
    """The trainer's initial method and first-epoch batches, rebuilt from the same seeds."""
    train = load_dataset("digits", "train").subset(12, seed=cfg.seed)
    seed_everything(cfg.seed)
    student = create_model("mlp", K, in_channels=1, **KWARGS)
    method = build_method(cfg.method, student, num_classes=K)
    loader = make_loader(train, 60, train=True, device="cpu", seed=cfg.seed, augment=Augment())
    loader.set_epoch(0)
    return method, list(loader)


def spherical_ce(h, W, y, tau):
    """GNC eq. 1 under the sphere constraint: CE of cos(h_i, w_k) / tau, written out."""
    logits = torch.stack([torch.stack([F.cosine_similarity(a, w, dim=0) for w in W]) for a in h]) / tau
    return F.cross_entropy(logits, y)


def cmf_step(W, h, y, beta):
    """GNC App. B.1: w_k <- normalise(beta w_k + (1 - beta) mean of normalise(h_i), y_i = k), present k only."""
    W = W.clone()
    for k in y.unique():
        mean = F.normalize(h[y == k], dim=1).mean(0)
        W[k] = F.normalize(beta * W[k] + (1 - beta) * mean, dim=0)
    return W


@pytest.mark.parametrize("head", list(HEADS))
def test_two_steps_through_the_trainer_match_the_definitions(tmp_path, head, config):
    # lr = 0: the backbone stays at its initial weights, so both steps can be recomputed by hand.
    cfg = config(tmp_path, head, "optim.lr=0", "train.epochs=1")
    method, [(x1, y1), (x2, y2)] = replay(cfg)
    student = method.student
    with torch.no_grad():
        h1, h2 = student.forward_features(x1), student.forward_features(x2)
    if head == "linear":
        assert type(student.head) is torch.nn.Linear
        losses = [F.cross_entropy(student.head(h), y).item() for h, y in ((h1, y1), (h2, y2))]
    else:
        W0 = student.head.weight.detach().clone()
        if head == "fixed":
            assert torch.equal(W0, closed_form_code(K, D).float()[ASSIGNMENT])  # class c on code row a[c]
        W1 = cmf_step(W0, h1, y1, 0.8) if head == "cmf" else W0  # CMF updates after the first forward
        tau = 0.2 if head == "cosine" else 0.1
        losses = [spherical_ce(h1, W0, y1, tau).item(), spherical_ce(h2, W1, y2, tau).item()]
    assert losses[0] == pytest.approx(FIRST_LOSS[head], rel=1e-5)
    assert method.train()(x1, y1)["loss"].item() == pytest.approx(losses[0], rel=1e-6)  # the method's own

    run = fit(cfg)
    [record] = read_metrics(run.run_dir)
    assert record["train_loss"] == pytest.approx(sum(losses) / 2, rel=1e-5)
    if head == "cmf":
        tensors, _ = load_tensors(Path(run.run_dir) / "checkpoint.safetensors")
        expected = cmf_step(cmf_step(W0, h1, y1, 0.8), h2, y2, 0.8)
        assert torch.allclose(tensors["method.student.head.weight"], expected, atol=1e-6)


@pytest.fixture(scope="module")
def trained(tmp_path_factory, config):
    """Each head trained for two epochs (four SGD steps) with the default learning rate."""
    root = tmp_path_factory.mktemp("heads")
    return {head: fit(config(root, head, "train.epochs=2")).run_dir for head in HEADS}


def checkpoint(run_dir):
    return load_tensors(Path(run_dir) / "checkpoint.safetensors")[0]


def test_which_heads_learn(tmp_path, trained, config):
    initial = {head: replay(config(tmp_path, head))[0].student.head.weight.detach() for head in HEADS}
    after = {head: checkpoint(trained[head])["method.student.head.weight"] for head in HEADS}
    for head in ("linear", "cosine", "cmf"):
        assert not torch.allclose(after[head], initial[head], atol=1e-4), head
    assert torch.equal(after["fixed"], initial["fixed"])  # a fixed code never moves
    assert torch.equal(checkpoint(trained["fixed"])["method.student.head.assignment"], torch.tensor(ASSIGNMENT))
    # Only parameters get momentum buffers: CMF and fixed rows are buffers, outside the optimizer.
    method = replay(config(tmp_path, "cmf"))[0]
    n_params = {head: len([*replay(config(tmp_path, head))[0].parameters()]) for head in ("cmf", "cosine")}
    assert n_params["cosine"] == n_params["cmf"] + 1
    momenta = {head: len([k for k in checkpoint(trained[head]) if k.endswith(".momentum_buffer")]) for head in HEADS}
    assert momenta["cmf"] == momenta["fixed"] == n_params["cmf"] and momenta["cosine"] == n_params["cosine"]
    assert "student.head.weight" not in dict(method.named_parameters())


def test_cmf_rows_get_no_gradient():
    cfg = method_config({"name": "spherical", "head": "cmf"})
    torch.manual_seed(0)
    method = build_method(cfg, create_model("mlp", K, in_channels=1, **KWARGS), num_classes=K)
    x, y = torch.randn(20, 1, 8, 8), torch.arange(20) % K
    before = method.student.head.weight.clone()
    out = method(x, y)
    out["loss"].backward()
    assert method.student.head.weight.grad is None and not method.student.head.weight.requires_grad
    assert not torch.equal(method.student.head.weight, before)  # updated by the rule instead
    method.eval()
    after = method.student.head.weight.clone()
    method(x, y)
    assert torch.equal(method.student.head.weight, after)  # evaluation never updates


@pytest.mark.parametrize("head", ["cosine", "cmf"])
def test_resume_restores_the_head(tmp_path, trained, head, config):
    fit(config(tmp_path, head, "train.epochs=1", name="split"))
    resumed = fit(load_config(tmp_path / "split" / "config.yaml", ["train.epochs=2"]), resume=True)
    a, b = checkpoint(trained[head]), checkpoint(resumed.run_dir)
    assert a.keys() == b.keys() and "method.student.head.weight" in a
    for key in a:
        assert torch.equal(a[key], b[key]), key


@pytest.mark.parametrize("head", list(HEADS))
def test_load_model_rebuilds_the_head(trained, head):
    model, meta = load_model(trained[head])
    saved = checkpoint(trained[head])
    expected_type = {"linear": torch.nn.Linear, "cosine": CosineHead, "cmf": ClassMeanFeatureHead,
                     "fixed": FixedHead}[head]
    assert type(model.head) is expected_type
    assert torch.equal(model.head.weight, saved["method.student.head.weight"])
    if head == "linear":
        assert "head" not in meta
        return
    assert meta["head"] == {
        "cosine": {"kind": "cosine", "temperature": 0.2},
        "cmf": {"kind": "cmf", "temperature": 0.1, "beta": 0.8},
        "fixed": {"kind": "fixed", "temperature": 0.1, "assignment": ASSIGNMENT},
    }[head]
    x = load_dataset("digits", "test").inputs[:8].float()
    tau = meta["head"]["temperature"]
    h = model.forward_features((x / 255 - meta["mean"][0]) / meta["std"][0])
    expected = F.normalize(h, dim=1) @ F.normalize(saved["method.student.head.weight"], dim=1).T / tau
    assert torch.allclose(model.forward_head(h), expected, atol=1e-5)


def test_load_model_rejects_a_bad_head_record(tmp_path, trained):
    state, meta = load_tensors(Path(trained["cmf"]) / "model.safetensors")
    save_tensors(tmp_path / "arc.safetensors", state, meta | {"head": {"kind": "arcface"}})
    with pytest.raises(KdcollapseError, match="unknown head kind in the model file 'arcface'. Valid choices: cmf, cosine, fixed"):
        load_model(tmp_path / "arc.safetensors")
    fixed_state, fixed_meta = load_tensors(Path(trained["fixed"]) / "model.safetensors")
    fixed_state["head.assignment"] = torch.zeros(K, dtype=torch.int64)
    save_tensors(tmp_path / "bad.safetensors", fixed_state, fixed_meta)
    with pytest.raises(KdcollapseError, match="assignment must be a permutation"):
        load_model(tmp_path / "bad.safetensors")


@pytest.mark.parametrize(
    "section,message",
    [
        ({"head": "arcface"}, "'method.head' must be one of linear, cosine, cmf, fixed; got 'arcface'"),
        ({"head": "fixed"}, "head=fixed needs method.code"),
        ({"head": "cmf", "code": "softmax"}, "method.code applies to method.head=fixed only"),
        ({"head": "cosine", "assignment": [1, 0]}, "method.assignment applies to method.head=fixed only"),
        ({"head": "cosine", "temperature": 0}, "method.temperature must be > 0"),
        ({"head": "cmf", "beta": 1.0}, r"method.beta must be in \[0, 1\)"),
    ],
)
def test_bad_method_config(section, message):
    with pytest.raises(ConfigError, match=message):
        method_config({"name": "spherical", **section})


def test_bad_codes_and_assignments(tmp_path):
    np.save(tmp_path / "k10_d3.npy", np.random.default_rng(0).normal(size=(K, 3)))

    def build(**section):
        cfg = method_config({"name": "spherical", "head": "fixed", **section})
        return build_method(cfg, create_model("mlp", K, in_channels=1, **KWARGS), num_classes=K)

    with pytest.raises(KdcollapseError, match=r"assignment must be a permutation of 0..9, got \[0, 0, 1"):
        build(code="softmax", assignment=[0, 0, 1, 2, 3, 4, 5, 6, 7, 8])
    with pytest.raises(KdcollapseError, match=r"assignment must be a permutation of 0..9, got \[1, 0\]"):
        build(code="softmax", assignment=[1, 0])
    with raises_naming(KdcollapseError, "(10, 3)", "(10, 5)"):
        build(code=str(tmp_path / "k10_d3.npy"))
    with pytest.raises(KdcollapseError, match="simplex ETF of K=10 vectors needs d >= K - 1"):
        build(code="etf")
    with pytest.raises(KdcollapseError, match="unknown code 'octahedron'. Valid choices: a .npy.*file, etf, softmax, tammes"):
        build(code="octahedron")
    with pytest.raises(KdcollapseError, match="no such file"):
        build(code=str(tmp_path / "missing.npy"))


def test_fixed_head_from_a_code_file(tmp_path):
    code = torch.randn(K, D, dtype=torch.float64)
    from safetensors.torch import save_file

    save_file({"W": code, "H": code.flip(0)}, tmp_path / "code.safetensors")
    cfg = method_config({"name": "spherical", "head": "fixed", "code": str(tmp_path / "code.safetensors"),
                         "code_key": "W", "assignment": ASSIGNMENT})
    method = build_method(cfg, create_model("mlp", K, in_channels=1, **KWARGS), num_classes=K)
    assert torch.allclose(method.student.head.weight, F.normalize(code, dim=1).float()[ASSIGNMENT])
    with pytest.raises(KdcollapseError, match="key"):  # two 2-D tensors: the file needs code_key
        build_method(method_config({"name": "spherical", "head": "fixed", "code": str(tmp_path / "code.safetensors")}),
                     create_model("mlp", K, in_channels=1, **KWARGS), num_classes=K)


# --------------------------------------------------------------------------- class selection
def test_select_classes_relabels_in_the_given_order():
    full = load_dataset("digits", "train")
    part = full.select_classes([7, 2, 5])
    assert part.classes == ["7", "2", "5"] and part.num_classes == 3
    for new, old in enumerate((7, 2, 5)):
        assert torch.equal(part.inputs[part.labels == new], full.inputs[full.labels == old])
    assert len(part) == int(sum((full.labels == c).sum() for c in (7, 2, 5)))
    assert part.mean == full.mean and part.std == full.std
    folder = FolderDataset([(f"img{i}.png", i % 4) for i in range(8)], ["a", "b", "c", "d"], (0.5,), (0.5,),
                           "toy", image_size=8, resize=8)
    picked = folder.select_classes([3, 1])
    assert picked.samples == [("img1.png", 1), ("img3.png", 0), ("img5.png", 1), ("img7.png", 0)]
    assert picked.classes == ["d", "b"]


@pytest.mark.parametrize("classes", [[1, 1], [3], [0, 10], [-1, 2]])
def test_select_classes_rejects_bad_lists(classes):
    with pytest.raises(DataError, match=r"at least two distinct class indices in \[0, 10\).*0 0, 1 1"):
        load_dataset("digits", "test").select_classes(classes)


def test_training_on_selected_classes(tmp_path, tiny_config):
    cfg = tiny_config(tmp_path / "r", *RUN[:-1], "data.classes=[4, 9, 0]", "train.epochs=1")
    run = fit(cfg)
    model, meta = load_model(run.run_dir)
    assert model.num_classes == 3 and meta["classes"] == ["4", "9", "0"] and meta["num_classes"] == 3


def test_mlp_bottleneck_is_a_linear_feature_layer():
    model = create_model("mlp", K, in_channels=1, **KWARGS)
    assert model.feature_dim == D and type(model.body[-1]) is torch.nn.Linear
    h = model.forward_features(torch.randn(64, 1, 8, 8))
    assert h.shape == (64, D) and (h < 0).any()  # not a ReLU output: features point anywhere
    n = sum(p.numel() for p in model.parameters())
    assert n == 64 * 32 + 32 + 32 * D + D + D * K + K
    with pytest.raises(KdcollapseError, match="bottleneck must be a positive width"):
        create_model("mlp", K, bottleneck=0)
