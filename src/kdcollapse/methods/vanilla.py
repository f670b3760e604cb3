"""Plain supervised training with cross-entropy: teachers, and the students' baseline."""

from __future__ import annotations

from dataclasses import dataclass

from kdcollapse.methods import Method, register_method


@register_method("vanilla")
class Vanilla(Method):
    """Minimise CE(student(x), y) (with the run's label smoothing)."""

    @dataclass
    class Config:
        pass

    def forward(self, x, y):
        logits = self.student(x)
        loss = self.cross_entropy(logits, y)
        return {"loss": loss, "logits": logits, "ce": loss.detach()}
