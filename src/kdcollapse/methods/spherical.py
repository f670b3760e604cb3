"""Cross-entropy training with the classifier heads of the GNC paper (Sections 4-5).

``head`` picks the student's classifier:

* ``linear``: the model's own ``nn.Linear`` head (standard training, as ``vanilla``);
* ``cosine``: trainable unit class vectors, logits = cos(h, w_k) / temperature (GNC eq. 1-2);
* ``cmf``: class-mean-feature classifier (Section 5, App. B.1): W <- normalise(beta W + (1 - beta)
  Hbar_batch) after every training step's forward pass, never trained by gradients;
* ``fixed``: a fixed code with a class assignment (Section 4): ``code`` is ``softmax``, ``tammes``, ``etf``
  or a file, ``assignment[c]`` the code row of class c.

The spherical heads normalise the features ``student.forward_features(x)`` and the class vectors; they
replace ``student.head``, so checkpoints, ``predict`` and ``model.safetensors`` carry them (the head's
``spec()`` is recorded in the model file and ``kdcollapse.train.load_model`` rebuilds it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from kdcollapse.errors import ConfigError
from kdcollapse.models.heads import ClassMeanFeatureHead, make_head
from kdcollapse.methods import Method, register_method
from kdcollapse.methods._distill import check_config


def equals(m, x, y):
    """CE(head(f(x)), y), the head (cosine, class-mean or fixed code; the method's connector) on the features."""
    return m.cross_entropy(m.student(x), y)


@register_method("spherical", equals=equals, checks=({"head": "linear"}, {"head": "cmf"}))
class Spherical(Method):
    """Minimise CE(head(f(x)), y) with the head chosen by ``head``; a CMF head is updated each step."""

    @dataclass
    class Config:
        head: Literal["linear", "cosine", "cmf", "fixed"] = "cosine"
        temperature: float = 0.1  # tau: logits = cos / tau (spherical heads; GNC Fig. 5: 0.1, Fig. 4: 0.05)
        beta: float = 0.9  # CMF momentum (GNC App. B.1)
        code: str | None = None  # fixed: softmax | tammes | etf | a .npy/.safetensors/.pt file of a (K, d) matrix
        code_key: str | None = None  # fixed: tensor name in a code file holding several (e.g. W)
        assignment: list[int] | None = None  # fixed: class c uses code row assignment[c]; None: identity

        def __post_init__(self):
            check_config(self, positive=("temperature",))
            if not 0 <= self.beta < 1:
                raise ConfigError(f"method.beta must be in [0, 1), got {self.beta}")
            fixed_only = [k for k in ("code", "code_key", "assignment") if getattr(self, k) is not None]
            if self.head != "fixed" and fixed_only:
                raise ConfigError(f"method.{fixed_only[0]} applies to method.head=fixed only (head is {self.head})")
            if self.head == "fixed" and self.code is None:
                raise ConfigError("method.head=fixed needs method.code: softmax, tammes, etf or a matrix file")

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        if config.head != "linear":
            self.student.head = make_head(
                config.head, self.student.feature_dim, self.student.num_classes, temperature=config.temperature,
                beta=config.beta, code=config.code, code_key=config.code_key, assignment=config.assignment,
            )

    def forward(self, x, y):
        h = self.student.forward_features(x)
        logits = self.student.forward_head(h)
        loss = self.cross_entropy(logits, y)
        if self.training and isinstance(self.student.head, ClassMeanFeatureHead):
            self.student.head.update(h, y)  # after the forward pass: this step's logits used W(t)
        return {"loss": loss, "logits": logits, "ce": loss.detach()}
