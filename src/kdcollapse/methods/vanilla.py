"""Plain supervised training with cross-entropy: teachers, and the students' baseline.

Two knobs of the VCI paper §6.3 (its transferability families): ``temperature`` τ, the CE is taken on
softmax(z/τ) (the reported logits stay z, so accuracies are unchanged by τ); and ``cosine_weight`` λ,
which adds λ·d̄_within, the batch's within-class cosine distance (Kornblith et al. 2021; the paper's
"average within-class cosine similarity" regulariser, with the sign that makes its "Cosine Similarity"
metric fall as λ grows, as in its Table 2). docs/distillation.md has the discussion.
"""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.losses import within_class_cosine_distance
from kdcollapse.methods import Method, register_method
from kdcollapse.methods._distill import check_config, loss


def equals(m, x, y):
    """CE(z/τ, y) + cosine_weight·within_class_cosine(features, y)."""
    cfg, h = m.config, m.student.forward_features(x)
    ce = m.cross_entropy(m.student.forward_head(h) / cfg.temperature, y)
    return ce + cfg.cosine_weight * loss("within_class_cosine")(h, y)


@register_method("vanilla", equals=equals, checks=({"cosine_weight": 0.5, "temperature": 2.0},))
class Vanilla(Method):
    """Minimise CE(student(x)/τ, y) + λ·d̄_within(features, y) (with the run's label smoothing)."""

    @dataclass
    class Config:
        temperature: float = 1.0  # τ: the CE sees z/τ (VCI §6.3 first family)
        cosine_weight: float = 0.0  # λ: weight of the batch within-class cosine distance (VCI §6.3 second family)

        def __post_init__(self):
            check_config(self, positive=("temperature",), non_negative=("cosine_weight",))

    def forward(self, x, y):
        cfg = self.config
        if cfg.cosine_weight == 0:
            logits = self.student(x)
            ce = self.cross_entropy(logits / cfg.temperature, y)
            return {"loss": ce, "logits": logits, "ce": ce.detach()}
        features = self.student.forward_features(x)
        logits = self.student.forward_head(features)
        ce = self.cross_entropy(logits / cfg.temperature, y)
        within = within_class_cosine_distance(features, y)
        loss = ce + cfg.cosine_weight * within
        return {"loss": loss, "logits": logits, "ce": ce.detach(), "cosine_within": within.detach()}
