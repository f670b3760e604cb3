"""A new user's first hour (issue 28): `--import` from the current directory, Hugging Face outputs and lazy
layers without a wrapper, analyze without matplotlib, help without "(default: None)", the quick demo."""

import argparse
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from kdcollapse.analysis import AnalyzeOptions, Subject, analyze
from kdcollapse.cli import build_parser, main
from kdcollapse.config import load_config
from kdcollapse.errors import KdcollapseError
from kdcollapse.models import as_classifier, create_model, register_model
from kdcollapse.runs import load_model
from kdcollapse.train import fit

TINY = ["data.name=digits", "train.epochs=1", "train.progress=false", "schedule.name=constant", "optim.lr=0.05",
        "data.batch_size=64"]


def test_import_finds_a_module_in_the_current_directory(tmp_path, monkeypatch, capsys):
    """The `kdcollapse` script's sys.path[0] is its bin folder, not the current directory."""
    from kdcollapse.models import _MODELS

    monkeypatch.setattr(_MODELS, "_entries", dict(_MODELS._entries))  # the registration lasts this test only
    monkeypatch.delitem(sys.modules, "first_hour_models", raising=False)
    (tmp_path / "first_hour_models.py").write_text(
        "from torch import nn\nfrom kdcollapse.models import register_model\n\n"
        "@register_model('first_hour_net')\ndef net(num_classes, in_channels=3):\n"
        "    return nn.Sequential(nn.Flatten(), nn.Linear(in_channels * 64, num_classes))\n")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path), ".")])
    assert main(["--import", "first_hour_models", "models", "list", "first_hour_*"]) == 0
    assert "first_hour_net" in capsys.readouterr().out


@pytest.mark.parametrize("name", ["../evil", "evil.py", "a/b", "", "-x", "1abc", "a..b"])
def test_import_of_a_path_is_one_line_error(name, capsys):
    assert main([f"--import={name}", "models", "list"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --import:") and err.count("\n") == 1 and "is not a module name" in err


class HFLike(nn.Module):
    """What a Hugging Face image classifier returns: an output object (a dict) with a ``logits`` field."""

    class Output(dict):
        def __getattr__(self, key):
            return self[key]

    def __init__(self, num_classes=10, as_mapping=True):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU())
        self.classifier = nn.Linear(16, num_classes)
        self.as_mapping = as_mapping

    def forward(self, pixel_values):
        logits = self.classifier(self.body(pixel_values))
        return self.Output(logits=logits, hidden_states=None) if self.as_mapping else argparse.Namespace(logits=logits)



class LazyNet(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.body = nn.Sequential(nn.Flatten(), nn.LazyLinear(16), nn.ReLU())
        self.fc = nn.LazyLinear(num_classes)

    def forward(self, x):
        return self.fc(self.body(x))


@pytest.fixture
def user_models(monkeypatch):
    """The two models above registered for one test only (the contract tests iterate over the registry)."""
    from kdcollapse.models import _MODELS

    monkeypatch.setattr(_MODELS, "_entries", dict(_MODELS._entries))
    register_model("_first_hour_hf")(lambda num_classes, in_channels=1: HFLike(num_classes))
    register_model("_first_hour_lazy")(lambda num_classes, in_channels=1: LazyNet(num_classes))


@pytest.mark.parametrize("as_mapping", [True, False])
def test_a_model_output_with_logits_needs_no_wrapper(as_mapping):
    model = as_classifier(HFLike(as_mapping=as_mapping)).eval()
    x = torch.randn(3, 1, 8, 8)
    assert torch.equal(model(x), model.module(x).logits)
    assert model.forward_features(x).shape == (3, 16)
    with pytest.raises(KdcollapseError, match="returned a tuple; a classifier must return its logits"):
        as_classifier(nn.Sequential(nn.Linear(4, 2), _Pair()))(torch.randn(1, 4))


class _Pair(nn.Module):
    def forward(self, x):
        return x, x


@pytest.mark.parametrize("name", ["_first_hour_hf", "_first_hour_lazy"])
def test_hugging_face_and_lazy_students_train_save_and_load(tmp_path, user_models, name):
    run = fit(load_config(None, [*TINY, f"model.name={name}", f"run_dir={tmp_path / 'r'}"]))
    assert run.last_acc > 20  # digits, one epoch: it learns
    model, meta = load_model(run.run_dir)
    assert meta["epoch"] == 1 and model.num_classes == 10 and model.feature_dim == 16
    with pytest.raises(KdcollapseError, match="has lazy layers .* need the input shape"):
        create_model("_first_hour_lazy", 10)


def test_analyze_without_matplotlib_writes_the_report_and_says_so_first(tmp_path, monkeypatch, caplog):
    import kdcollapse.analysis._analyze as analyze_module

    monkeypatch.setattr(analyze_module, "available", lambda name: False)
    model = create_model("mlp", 10, in_channels=1, input_size=8, hidden=[16]).eval()
    data = torch.utils.data.TensorDataset(torch.rand(40, 1, 8, 8), torch.arange(40) % 10)
    with caplog.at_level("WARNING", logger="kdcollapse"):
        report = analyze(Subject(model, data, "test"), tmp_path / "a", AnalyzeOptions(progress=False))
    assert report["figures"] == {} and not list((tmp_path / "a").glob("*.png"))
    assert "pip install 'kdcollapse[analysis]'" in caplog.text
    assert "matplotlib was not installed" in (tmp_path / "a" / "analysis.md").read_text()
    monkeypatch.setitem(sys.modules, "sklearn.manifold", None)  # t-SNE asked for, scikit-learn missing
    with pytest.raises(KdcollapseError, match=r"t-SNE .*needs scikit-learn"):
        analyze(Subject(model, data, "test"), tmp_path / "b", AnalyzeOptions(progress=False, tsne_per_class=2))
    assert not (tmp_path / "b").exists()  # refused before any work


def _parsers(parser: argparse.ArgumentParser, prefix=()):
    yield prefix, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _parsers(sub, (*prefix, name))


def test_no_help_says_default_none():
    helps = {" ".join(path): p.format_help() for path, p in _parsers(build_parser())}
    assert len(helps) > 15
    for path, text in helps.items():
        assert "(default: None)" not in text and "(default: False)" not in text, path


def test_the_quick_demo_is_a_fraction_of_the_full_one():
    from kdcollapse.experiments.demo import PLANS, quick_plan

    for plan in PLANS.values():
        quick = quick_plan(plan)
        # the students see few images and cost little: the quick plan shortens the teacher, keeps KD only
        assert quick.methods == ("kd",) and quick.teacher_epochs * 3 <= plan.teacher_epochs
        assert quick.student_epochs == plan.student_epochs
    assert "--quick" in dict(_parsers(build_parser()))[("demo",)].format_help()


def test_constant_features_warn_that_the_metrics_are_undefined(tmp_path, caplog):
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 4), nn.ReLU(), nn.Linear(4, 10))
    with torch.no_grad():
        model[1].weight.zero_()
        model[1].bias.fill_(1.0)  # every input gives the same feature vector
    data = torch.utils.data.TensorDataset(torch.rand(40, 1, 8, 8), torch.arange(40) % 10)
    with caplog.at_level("WARNING", logger="kdcollapse"):
        report = analyze(Subject(model, data, "test"), tmp_path, AnalyzeOptions(progress=False))
    undefined = [k for k, v in report["metrics"].items() if isinstance(v, float) and v != v]
    assert undefined and "undefined (NaN): the features have no spread" in caplog.text


REPO = Path(__file__).resolve().parents[1]


def _anchors(page: Path) -> set[str]:
    """The anchors GitHub makes of a markdown page's headings (lower case, punctuation dropped, spaces to
    hyphens, ``-1``, ``-2`` for repeats) and its explicit ``<a name=...>``/``<a id=...>``; code blocks skipped."""
    import re

    found, seen, code = set(), {}, False
    for line in page.read_text().splitlines():
        if line.startswith("```"):
            code = not code
        if code:
            continue
        if heading := re.match(r"#+\s+(.*)", line):
            slug = re.sub(r"[^\w\- ]", "", heading.group(1).strip().lower()).replace(" ", "-")
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
        found.update(re.findall(r'<a (?:name|id)="([^"]+)"', line))
    return found


def test_every_anchor_of_a_link_in_the_readme_and_docs_is_a_heading_of_its_page():
    """The dead anchor of docs/losses.md the first hour found, and any other: a link ``page.md#anchor`` (or
    ``#anchor`` in the same page) must name a heading of that page."""
    import re

    dead = []
    for page in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or "#" not in target:
                continue
            file, _, anchor = target.partition("#")
            linked = (page.parent / file) if file else page
            if linked.suffix == ".md" and linked.is_file() and anchor not in _anchors(linked):
                dead.append(f"{page.relative_to(REPO)}: {target}")
    assert dead == []


def test_the_python_blocks_of_the_models_page_run(tmp_path, monkeypatch):
    """The first hour found a docs/models.md snippet using an undefined ``timm_model``: every ```python block
    of the page runs, in order in one namespace (a later block uses an earlier one's ``x``), in this process
    with a copy of the model registry (the last block registers a model, which a second registration would
    refuse)."""
    import re

    from kdcollapse.models import _MODELS

    blocks = re.findall(r"^```python\n(.*?)^```", (REPO / "docs" / "models.md").read_text(), flags=re.S | re.M)
    assert len(blocks) >= 4
    monkeypatch.setattr(_MODELS, "_entries", dict(_MODELS._entries))  # the registration lasts this test only
    monkeypatch.chdir(tmp_path)
    namespace: dict = {"__name__": "models_page"}
    exec(compile("\n".join(blocks), "docs/models.md", "exec"), namespace)  # noqa: S102 - the page's own examples
    assert "tinynet" in _MODELS


def test_the_spectra_plot_leaves_out_eigenvalues_below_1e_12_of_the_largest(tmp_path, monkeypatch):
    """Issue 28: float32 features' rounding noise stretched the y-axis down to 1e-17 and hid the spectrum."""
    pytest.importorskip("matplotlib")
    import kdcollapse.analysis._plots as plots

    limits = []
    monkeypatch.setattr(plots, "_save", lambda fig, path, source: limits.append(fig.axes[0].get_ylim()) or "")
    spectra = {"total": [10.0, 1.0, 1e-3, 1e-17, 0.0], "between": [9.0, 0.5, 1e-16, 0.0, 0.0],
               "within": [1.0, 1e-2, 1e-4, 1e-20, 0.0]}
    plots.plot_spectra(spectra, 2, tmp_path / "s.png", "t")
    (bottom, top), = limits
    assert 1e-13 <= bottom <= 1e-4 and top >= 10.0
