"""Shared fixtures: the tiny run every training test starts from, a trained tiny teacher, a tiny model.

A test module states only how its runs differ from the tiny run (``tiny_config(run_dir, *overrides)``;
later overrides win), so a new required option is added here once.
"""

import os

import pytest
import torch

from kdcollapse.config import load_config
from kdcollapse.models import create_model

# Tiny models and data: more threads only add overhead, and CI machines have 2 cores.
torch.set_num_threads(int(os.environ.get("KDCOLLAPSE_TEST_THREADS", "1")))
# transformers' "Loading weights" bars (and huggingface_hub's) are stderr noise in tests; the variable is read
# when they are imported, here and in every subprocess a test starts.
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"

# scikit-learn's digits (1×8×8 images, 10 classes: real data, offline), 20 training and 10 test images per
# class, an MLP with one hidden layer of 16: one epoch takes well under a second.
TINY_RUN = ("data.name=digits", "data.batch_size=50", "data.train_per_class=20", "data.test_per_class=10",
            "train.progress=false", "optim.lr=0.05", "schedule.name=constant", "model.name=mlp",
            "model.kwargs={input_size: 8, hidden: [16]}")  # fmt: skip


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


requires_fashion_mnist = pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)


@pytest.fixture(scope="session")
def tiny_overrides() -> list[str]:
    """The tiny run as ``key=value`` overrides (for the command line: ``main(["train", ..., *tiny_overrides])``)."""
    return list(TINY_RUN)


@pytest.fixture(scope="session")
def tiny_config():
    """``tiny_config(run_dir, *overrides)``: the tiny run's config writing to ``run_dir``, with ``overrides``."""

    def make(run_dir, *overrides):
        return load_config(None, [*TINY_RUN, f"run_dir={run_dir}", *overrides])

    return make


@pytest.fixture(scope="session")
def digits_teacher(tmp_path_factory, tiny_config):
    """Run directory of a vanilla tiny run trained for 2 epochs: the teacher of every distillation test.
    Pinned first losses (tests/test_recipes.py) depend on it: change its config and re-pin them."""
    from kdcollapse.train import fit

    return fit(tiny_config(tmp_path_factory.mktemp("teacher"), "train.epochs=2")).run_dir


@pytest.fixture
def tiny_linear_model():
    """A linear classifier (no hidden layer) of 1×4×4 images in [0, 1] into 3 classes, in eval mode: small
    enough for exhaustive checks of attacks and metrics."""
    torch.manual_seed(0)
    return create_model("mlp", 3, in_channels=1, input_size=4, hidden=()).eval()


@pytest.fixture(scope="session")
def digits_conv_teacher(tmp_path_factory, tiny_config):
    """Like ``digits_teacher``, a ``convnet_small``: the teacher of methods that read stage maps (FitNet, AT,
    OFD, ...), whose tiny MLP has none."""
    from kdcollapse.train import fit

    return fit(tiny_config(tmp_path_factory.mktemp("conv_teacher"), "train.epochs=2", "model.name=convnet_small",
                           "model.kwargs={}")).run_dir
