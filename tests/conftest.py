import os

import pytest
import torch

# Tiny models and data: more threads only add overhead, and CI machines have 2 cores.
torch.set_num_threads(int(os.environ.get("KDCOLLAPSE_TEST_THREADS", "1")))

FASHION_MNIST_DIR = "/usr/share/datasets/fashion-mnist"


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


requires_fashion_mnist = pytest.mark.skipif(
    not os.path.exists(os.path.join(FASHION_MNIST_DIR, "train-images-idx3-ubyte.gz")),
    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)",
)
