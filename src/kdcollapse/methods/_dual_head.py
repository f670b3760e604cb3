"""Dual-head students (DHKD paper §3.3) and the gradient alignment of its CIFAR-100 recipe.

The student's backbone f feeds two heads: its own linear head g, trained by cross-entropy only, and an
auxiliary head g′ owned by the method, trained by the distillation loss only. Both losses reach the
backbone. Nothing is detached: the two heads are simply disjoint parameters, so CE has no path into g′
and the distillation loss none into g. Prediction and every reported accuracy use g (``predict``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

import torch
import torch.distributed as dist
from torch import nn

from kdcollapse.methods._distill import Distiller, check_config
from kdcollapse.distributed import all_reduce_sum

AUX_HIDDEN = 200  # hidden width of the non-linear auxiliary head (DHKD App. F)


def make_aux_head(kind: str, feature_dim: int, num_classes: int) -> nn.Module:
    """g′: ``linear`` (same-architecture pairs) or the one-hidden-layer ``mlp`` of the official code
    for cross-architecture pairs: Linear(d, 200) → Dropout(0.1) → BatchNorm1d(200) → ReLU → Linear(200, K)."""
    if kind == "linear":
        return nn.Linear(feature_dim, num_classes)
    return nn.Sequential(
        nn.Linear(feature_dim, AUX_HIDDEN), nn.Dropout(0.1), nn.BatchNorm1d(AUX_HIDDEN), nn.ReLU(inplace=True),
        nn.Linear(AUX_HIDDEN, num_classes),
    )


def align_gradients(g_ce: torch.Tensor, g_distill: torch.Tensor, projected: int) -> torch.Tensor:
    """G_CE + G_proj, the update of DHKD's gradient alignment (DHKD §3.3, after Yu et al. 2020).

    ``g_ce``, ``g_distill``: the two losses' gradients flattened into vectors of one length; the first
    ``projected`` entries take part in the projection:
    G_proj = G − (G·G_CE / ‖G_CE‖²)·G_CE if G·G_CE < 0 (else G), with G = G_distill, both restricted to
    those entries; the remaining entries are G_CE + G_distill unchanged. The sign test runs on the
    device (``torch.where``), so no host synchronisation is needed.
    """
    a = g_ce[:projected]
    dot = torch.dot(g_distill[:projected], a)
    tiny = torch.finfo(a.dtype).tiny
    coef = torch.where(dot < 0, dot / torch.dot(a, a).clamp_min(tiny), torch.zeros_like(dot))
    update = g_ce + g_distill
    update[:projected].sub_(coef * a)
    return update


def _flat_grad(loss: torch.Tensor, params: list[nn.Parameter], retain_graph: bool = False) -> torch.Tensor:
    grads = torch.autograd.grad(loss, params, retain_graph=retain_graph, allow_unused=True)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, params)])


@dataclass
class DualHeadConfig:
    ce_weight: float = 1.0  # weight of CE(g(f(x)), y)
    aux_head: Literal["linear", "mlp"] = "linear"  # g′; mlp for cross-architecture pairs
    alignment: Literal["off", "global", "shared"] = "off"  # gradient alignment (DHKD CIFAR recipe: global)
    distill_until: int | None = None  # switch the distillation loss off after this epoch (ImageNet: 50)

    def __post_init__(self):
        check_config(self, non_negative=("ce_weight", "distill_until"))


class DualHead(Distiller):
    """Base of the dual-head methods: builds g′, runs both heads, and implements gradient alignment.

    ``alignment``: ``global`` is the official mode (two gradient computations, every trainable
    parameter of student and g′ flattened into one vector, one dot product); ``shared`` projects over
    the backbone's parameters only, so the heads keep their own gradients (g gets exactly G_CE, g′
    exactly G_distill). Under DDP (``manual_gradient_sync``) the trainer skips DDP's all-reduce and
    :meth:`backward` averages both gradients over the processes before projecting, so the projection
    is that of the global-batch gradients.

    Subclasses set ``distill_name`` (the logged part) and implement :meth:`distill_loss`.
    """

    distill_name: ClassVar[str]
    extra_heads = {"aux": "aux_head"}

    def __init__(self, student, config, *, num_classes, **kwargs):
        super().__init__(student, config, num_classes=num_classes, **kwargs)
        self.aux_head = make_aux_head(config.aux_head, self.student.feature_dim, num_classes)
        self.manual_gradient_sync = config.alignment != "off"

    def distill_loss(self, aux_logits: torch.Tensor, teacher_logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The weighted distillation loss of g′(f(x)) against the teacher's logits."""
        raise NotImplementedError

    def distilling(self) -> bool:
        until = self.config.distill_until
        return until is None or self.epoch < until

    def forward(self, x, y):
        h = self.student.forward_features(x)
        logits = self.student.forward_head(h)
        aux = self.aux_head(h)
        ce = self.config.ce_weight * self.cross_entropy(logits, y)
        if self.distilling():
            distill = self.distill_loss(aux, self.teacher_logits(x), y)
        else:  # no teacher pass; a zero term keeps every parameter in the graph, as DDP requires
            distill = 0.0 * aux.sum()
        return {"loss": ce + distill, "logits": logits, "ce": ce, self.distill_name: distill}

    def backward(self, out, scale):
        if self.config.alignment == "off":
            return super().backward(out, scale)
        params, projected = self._alignment_parameters()
        g_ce = _flat_grad(scale(out["ce"]), params, retain_graph=True)
        g_distill = _flat_grad(scale(out[self.distill_name]), params)
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            both = all_reduce_sum(torch.stack([g_ce, g_distill])) / dist.get_world_size()
            g_ce, g_distill = both[0], both[1]
        update = align_gradients(g_ce, g_distill, projected)
        for p, g in zip(params, update.split([p.numel() for p in params])):
            p.grad = g.view_as(p)

    def _alignment_parameters(self) -> tuple[list[nn.Parameter], int]:
        """Trainable parameters ordered backbone, g, g′, and how many leading entries are projected."""
        head = {id(p) for p in self.student.head.parameters()}
        backbone = [p for p in self.student.parameters() if p.requires_grad and id(p) not in head]
        heads = [p for p in [*self.student.head.parameters(), *self.aux_head.parameters()] if p.requires_grad]
        params = backbone + heads
        if self.config.alignment == "shared":
            return params, sum(p.numel() for p in backbone)
        return params, sum(p.numel() for p in params)
