"""Every ```python block of README.md and docs/*.md runs (issue 42): here, in page order in one namespace per
page, from a folder whose ``data/`` holds tiny Fashion-MNIST files in the official IDX format (what
``load_dataset`` finds first after ``$KDCOLLAPSE_DATA``), with the names a page says its reader already has
(``model``, ``x``, ``y``, ...) given beforehand; or in the test named in ELSEWHERE; or, for a real model or
minutes of attacks, in the heavy test below. A block a page adds is run, or this test fails."""

from __future__ import annotations

import re
import sys
import types

import pytest

from doc_commands import PAGES, REPO
from formats import write_idx_files

# (page, a line of the block) -> the test that runs the block; "" stands for every block of the page
ELSEWHERE = {
    ("ARCHITECTURE.md", ""): "tests/test_guides.py (each guide through its registry's contract)",
    ("models.md", ""): "tests/test_first_hour.py::test_the_python_blocks_of_the_models_page_run",
    ("metrics.md", ""): "tests/test_metrics.py::test_docs_examples_run (as a doctest: its printed results)",
    ("geometry.md", "gnc2 = min_one_vs_rest_distance(W)"):
        "tests/test_metrics_vocab.py::test_the_gnc2_example_of_the_geometry_page_runs",
    ("language_models.md", "akl = L.fused_head_loss("): "tests/test_losses_cross_tokenizer.py::test_the_docs_examples_run",
    ("language_models.md", "loss = uld_loss("): "tests/test_losses_cross_tokenizer.py::test_the_docs_examples_run",
    ("losses.md", '@register_loss("kd", kind="logits"'): "none: an excerpt of kdcollapse.losses (signature elided)",
}
HEAVY = {
    ("language_models.md", 'lm.load_language_model("smollm2-135m")'): "loads SmolLM2-135M (minutes the first time)",
    ("adversarial.md", "autoattack_standard(model, x, y"): "the standard AutoAttack on 64 images (minutes)",
    ("geometry.md", "code = softmax_code(100, 10, restarts=8)"): "a 100-class softmax code, 8 restarts (minutes)",
    ("adversarial.md", 'load_config("configs/adversarial/fashion_mnist_ikl_at.yaml"'):
        "an adversarial-training epoch of its 1,500 images per class",
}
# What each page's reader has before its blocks (a trained model, a batch, features), as the page describes them.
GIVEN = {
    "geometry.md": """
import torch
import torch.nn.functional as F
from kdcollapse.models import create_model
model = create_model("mlp", 10, in_channels=1, input_size=8, hidden=[16])
from kdcollapse.geometry import softmax_code
from kdcollapse.models.heads import ClassMeanFeatureHead, CosineHead, FixedHead
x, y = torch.rand(8, 1, 8, 8), torch.arange(8) % 10
code, perm = softmax_code(10, 16, restarts=1, steps=5), torch.randperm(10)
""",
    "analysis.md": """
import torch
from kdcollapse.cli import main
from kdcollapse.models import create_model
tiny = ["train.epochs=1", "train.progress=false", "data.num_workers=0"]
assert main(["train", "--config", "configs/fashion_mnist/teacher.yaml", *tiny]) == 0
assert main(["distill", "--config", "configs/fashion_mnist/dhkd.yaml", "run_dir=runs/fmnist_dhkd", *tiny]) == 0
my_model = create_model("mlp", 10, in_channels=1, input_size=28, hidden=[16]).eval()
my_test_dataset = torch.utils.data.TensorDataset(torch.rand(20, 1, 28, 28), torch.arange(20) % 10)
model = my_model
loader = torch.utils.data.DataLoader(my_test_dataset, batch_size=8)
aux_head = torch.nn.Linear(16, 10)
teacher = None
""",
    "data.md": """
import torch
my_train = torch.utils.data.TensorDataset(torch.rand(20, 1, 8, 8), torch.arange(20) % 10)
my_test = torch.utils.data.TensorDataset(torch.rand(10, 1, 8, 8), torch.arange(10) % 10)
open("run.yaml", "w").write("data: {name: user}\\nmodel: {name: mlp, kwargs: {input_size: 8, hidden: [16]}}\\n"
                            "train: {epochs: 1, progress: false}\\nrun_dir: runs/user\\n")
""",
    "intra_class.md": """
import torch
features, labels = torch.randn(30, 4, generator=torch.Generator().manual_seed(0)), torch.arange(30) % 3
""",
    "distillation.md": """
from kdcollapse.cli import main
assert main(["train", "--config", "configs/fashion_mnist/teacher.yaml", "train.epochs=1", "train.progress=false",
             "data.num_workers=0"]) == 0
""",
}


def python_blocks():
    """(page name, first line number, text) of every ```python block."""
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for m in re.finditer(r"^```python\n(.*?)^```", text, flags=re.S | re.M):
            yield page.name, text[:m.start()].count("\n") + 2, m.group(1)


def _listed(table: dict, page: str, block: str) -> str | None:
    return next((why for (p, line), why in table.items() if p == page and line in block), None)


def where(page: str, block: str) -> str:
    if _listed(ELSEWHERE, page, block):
        return "elsewhere"
    return "heavy" if _listed(HEAVY, page, block) else "here"


BLOCKS = list(python_blocks())


def test_every_block_is_run_somewhere_and_every_listed_block_exists():
    places = [where(p, b) for p, _, b in BLOCKS]
    assert places.count("here") >= 10, places
    for table in (ELSEWHERE, HEAVY):
        for page, line in table:
            assert any(p == page and line in b for p, _, b in BLOCKS), (page, line)


@pytest.fixture
def folder(tmp_path, monkeypatch):
    write_idx_files(tmp_path / "data" / "fashion_mnist", n_train=120, n_test=20)  # data.md takes 10 per class
    (tmp_path / "configs").symlink_to(REPO / "configs")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("KDCOLLAPSE_DATA", raising=False)
    return tmp_path


def run_page(page: str, blocks: list[str]) -> dict:
    """The blocks in one module's namespace (dataclasses and registrations look their module up)."""
    from kdcollapse.data._dataset import _DATASETS
    from kdcollapse.losses._catalog import _LOSSES
    from kdcollapse.methods import _METHODS
    from kdcollapse.models import _MODELS

    module = types.ModuleType(f"doc_{page.removesuffix('.md')}")
    sys.modules[module.__name__] = module
    try:
        with _LOSSES.scratch(), _METHODS.scratch(), _MODELS.scratch(), _DATASETS.scratch():
            exec(compile(GIVEN.get(page, ""), f"{page} (given)", "exec"), module.__dict__)  # noqa: S102
            for i, block in enumerate(blocks):
                exec(compile(block, f"docs/{page} block {i}", "exec"), module.__dict__)  # noqa: S102
    finally:
        del sys.modules[module.__name__]
    return module.__dict__


PAGES_HERE = sorted({p for p, _, b in BLOCKS if where(p, b) == "here"})


@pytest.mark.parametrize("page", PAGES_HERE)
def test_the_python_blocks_of_a_page_run(page, folder):
    blocks = [b for p, _, b in BLOCKS if p == page and where(p, b) == "here"]
    names = run_page(page, blocks)
    assert names  # the checks are the blocks' own: each ran to its end


HEAVY_PAGES = sorted({p for p, _, b in BLOCKS if where(p, b) == "heavy"})


@pytest.mark.heavy
@pytest.mark.parametrize("page", HEAVY_PAGES)
def test_the_heavy_python_blocks_of_a_page_run(page, folder):
    """In page order, as written, on the installed datasets (the tiny files moved out of the way)."""
    import shutil

    shutil.rmtree(folder / "data")
    run_page(page, [b for p, _, b in BLOCKS if p == page and where(p, b) == "heavy"])
