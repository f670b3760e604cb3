"""Small models that tests share (imported by test modules, like ``loss_references``)."""

from torch import nn

from kdcollapse.models._base import Classifier


class LinearEmbedding(Classifier):
    """One linear layer to a ``dim``-dimensional embedding, then the zoo's linear head: features that a few
    SGD steps move visibly, for the tests of training knobs on the features."""

    def __init__(self, d_in: int, dim: int, num_classes: int):
        super().__init__()
        self.body = nn.Linear(d_in, dim)
        self._init_head(dim, num_classes)

    def forward_features(self, x):
        return self.body(x)
