"""Teachers that keep intra-class diversity: CE + λ·L_Intra behind a margin gate, with per-class caches.

The intra-class contrastive KD paper (§3.2 eq. 4-5, §3.3 eq. 6-7, Algorithm 1) trains the *teacher*
with L_Teacher = CE(y, p_t) + λ·L_Intra, where L_Intra is the (n+1)-tuplet loss whose positive is an
augmented view of the anchor and whose negatives are other samples of the anchor's own class, so that
same-class embeddings are pushed apart and the teacher's soft labels keep intra-class variety.

How this module reads the paper (docs/intra_class.md has the full discussion):

- Embedding φ(x): the L2-normalised penultimate feature ``student.forward_features(x)``. The theory
  (§4.1) takes φ: X → R^d with d > c and ‖φ(x)‖ = 1, which is the feature, not the c logits; the paper
  has no projection head, so none is added.
- Views: the trainer's loader yields two independently augmented views (``views = 2``); both go
  through the network in one batch (so BatchNorm sees 2B images). CE and the margin use the first view
  only; the second view's embedding is the positive x⁺.
- Gate (eq. 6-7): an anchor joins only if ρ_x = p_x[y] − max_{j≠y} p_x[j] > δ, with p_x the softmax of
  the first view's logits (a selection, so no gradient flows through ρ).
- Pipeline (§3.3, last paragraph): the (anchor, positive) embeddings of gated samples are appended to
  a cache of their class. When a class holds at least ``cache_min_count`` of them (only the newest
  ``cache_capacity`` are kept), L_Intra is computed over that class's pool and the class's cache is
  cleared: every pool member is an anchor with its own positive, and every other member's anchor
  embedding is one of its negatives. The loss is the mean over all anchors of the pools used in the
  step (0 when none is ready).
- Gradients: embeddings computed in the current step carry gradient wherever they appear (anchor,
  positive or negative slot); embeddings cached in earlier steps are stored detached (the weights that
  produced them have since been updated), so they act as constants, as the entries of a memory queue.
- The cache is part of the method's ``extra_state``, so a resumed run continues bit for bit; under DDP
  each process keeps a cache of its own samples (and a resume restores rank 0's cache on every rank).

Logged per epoch (``epoch_metrics``): ``gate_fraction``, ``cache_fill``, ``pool_size``, ``intra_loss``
and the quantities of Theorem 1-2 on each batch's first-view embeddings, averaged over the epoch by
:class:`kdcollapse.metrics.IntraClassSimilarity`: ``d_intra``, ``d_inter``, ``d_ratio``,
``tuplet_intra``, ``tuplet_inter``, ``tuplet_ratio`` (smaller d_intra: a more diverse class).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.distributed import all_reduce_sum
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.losses import intra_class_contrastive_loss
from kdcollapse.methods import Method, register_method
from kdcollapse.methods._distill import at_least_float32
from kdcollapse.metrics import IntraClassSimilarity, margin

_STATS = ("seen", "gated", "pool_anchors", "pool_loss", "pool_members")  # the gate's and pipelines' epoch sums


def classification_margin(logits: Tensor, target: Tensor) -> Tensor:
    """ρ_x = p_x[y] − max_{j≠y} p_x[j] with p_x = softmax(logits) (eq. 6), in [−1, 1]; shape (B,)."""
    return margin(logits.float().softmax(dim=1), target)


def equals(m, x, y):
    """CE(first-view logits, y) + intra_weight·L_Intra, the registered intra_class_contrastive over the pools
    the method's per-class pipeline (its connector) builds from the margin-gated pairs of views."""
    cfg, batch = m.config, x.shape[0]
    embeddings, logits = m._embed(m.student.forward_features(torch.cat(x.unbind(1))), batch)
    phi = F.normalize(embeddings, dim=1) if cfg.normalize else embeddings
    gate = classification_margin(logits.detach(), y) > cfg.margin_threshold
    return m.cross_entropy(logits, y) + cfg.intra_weight * m._pipeline_loss(phi[:batch][gate], phi[batch:][gate],
                                                                            y[gate])


@register_method("intra_class_teacher", equals=equals, checks=(  # ready pools and every anchor gated in
    {"cache_min_count": 2, "margin_threshold": -1.0},
    {"cache_min_count": 2, "margin_threshold": -1.0, "embedding": "logits", "normalize": False}))
class IntraClassTeacher(Method):
    """L_Teacher = CE(y, p_t) + λ·L_Intra (eq. 5) with the margin gate (eq. 7) and per-class pipelines."""

    @dataclass
    class Config:
        intra_weight: float = 0.02  # λ of eq. 5; the paper uses 0.01-0.03
        margin_threshold: float = 0.5  # δ of eq. 7: anchors join if ρ_x > δ (the paper gives no value)
        cache_capacity: int = 64  # per class: at most this many (newest) embeddings enter one loss
        cache_min_count: int = 16  # a class's pipeline is used, then cleared, once it holds this many
        temperature: float = 1.0  # τ of L_Intra; eq. 4 has none (τ = 1)
        embedding: Literal["features", "logits"] = "features"  # φ: penultimate features or classifier outputs f(x)
        normalize: bool = True  # L2-normalise φ in L_Intra (the theory's ‖φ‖ = 1); eqs. 1, 4, 7 as written: False

        def __post_init__(self):
            _check_config(self)

    views = 2

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        dim = self.embedding_dim
        self._cache = {"anchors": torch.zeros(0, dim), "positives": torch.zeros(0, dim),
                       "labels": torch.zeros(0, dtype=torch.long)}
        self._stats = torch.zeros(len(_STATS), dtype=torch.float64)
        self.similarity = IntraClassSimilarity()  # d_intra, d_inter, tuplet losses of each batch's embeddings

    def forward(self, x: Tensor, y: Tensor) -> dict[str, Tensor]:
        if x.dim() < 3 or x.shape[1] != self.views:
            raise KdcollapseError(
                f"intra_class_teacher needs two augmented views per image, x of shape (B, 2, ...); got "
                f"{tuple(x.shape)}. The trainer builds its loader with views=2 (make_loader(..., views=2))"
            )
        batch = x.shape[0]
        self._stats = self._stats.to(y.device)  # a plain tensor (not a buffer, which DDP would broadcast)
        features = self.student.forward_features(torch.cat(x.unbind(1)))  # first views, then second views
        embeddings, logits = self._embed(features, batch)
        ce = self.cross_entropy(logits, y)
        unit = F.normalize(at_least_float32(embeddings), dim=1)
        phi = unit if self.config.normalize else at_least_float32(embeddings)
        anchors, positives = phi[:batch], phi[batch:]
        with torch.no_grad():
            gate = classification_margin(logits.detach(), y) > self.config.margin_threshold
        intra = self._pipeline_loss(anchors[gate], positives[gate], y[gate])
        self.similarity.update(unit[:batch].detach(), unit[batch:].detach(), y)  # diagnostics: unit φ
        self._add(seen=batch, gated=gate.sum())
        loss = ce + self.config.intra_weight * intra
        return {"loss": loss, "logits": logits, "ce": ce.detach(), "intra": intra.detach()}

    @property
    def embedding_dim(self) -> int:
        """Width of φ: the feature dimension d, or the number of classes K for ``embedding: logits``."""
        return self.student.num_classes if self.config.embedding == "logits" else self.student.feature_dim

    def _embed(self, features: Tensor, batch: int) -> tuple[Tensor, Tensor]:
        """(φ of both views (2B, ·), first-view logits (B, K)): φ = the features, or the classifier outputs
        f(x) of eqs. 1, 4, 7 (then the second view also goes through the head)."""
        if self.config.embedding == "logits":
            outputs = self.student.forward_head(features)
            return outputs, outputs[:batch]
        return features, self.student.forward_head(features[:batch])

    # ------------------------------------------------------------------------------ pipeline
    def _pipeline_loss(self, anchors: Tensor, positives: Tensor, labels: Tensor) -> Tensor:
        """Append the gated (anchor, positive) embeddings to their classes' caches; L_Intra over the
        classes whose pool is ready, whose caches are then cleared. 0 if no class is ready."""
        cfg, cache = self.config, self._cache
        a = torch.cat([cache["anchors"].to(anchors), anchors])
        p = torch.cat([cache["positives"].to(positives), positives])
        y = torch.cat([cache["labels"].to(labels.device), labels])
        order = torch.argsort(y, stable=True)  # grouped by class, oldest first within a class
        a, p, y = a[order], p[order], y[order]
        counts = torch.bincount(y, minlength=self.num_classes)
        rank = torch.arange(len(y), device=y.device) - (counts.cumsum(0) - counts)[y]  # position in class
        kept = counts.clamp(max=cfg.cache_capacity)
        slot = rank - (counts - kept)[y]  # position among the class's newest `kept` entries
        ready = kept >= cfg.cache_min_count
        use, stay = (slot >= 0) & ready[y], (slot >= 0) & ~ready[y]
        self._cache = {"anchors": a[stay].detach(), "positives": p[stay].detach(), "labels": y[stay]}
        if not bool(use.any()):
            return anchors.new_zeros(())
        a, p, y, slot = a[use], p[use], y[use], slot[use]
        group = (ready.cumsum(0) - 1)[y]  # index of the anchor's class among the ready classes
        size = kept[ready]
        pool = a.new_zeros(len(size), int(size.max()), a.shape[1]).index_put((group, slot), a)
        j = torch.arange(pool.shape[1], device=a.device)
        valid = (j < size[group, None]) & (j != slot[:, None])  # the other members of the anchor's pool
        loss = intra_class_contrastive_loss(a, p, pool[group], valid, temperature=cfg.temperature,
                                            normalize=cfg.normalize)
        self._add(pool_anchors=len(a), pool_loss=loss.detach() * len(a), pool_members=size[group].sum())
        return loss

    def _add(self, **values) -> None:
        """Add named batch statistics (tensors on the device or numbers) to the epoch's sums, without a sync."""
        device = self._stats.device
        index = torch.tensor([_STATS.index(name) for name in values], device=device)
        update = torch.stack([torch.as_tensor(v, dtype=torch.float64, device=device) for v in values.values()])
        self._stats.index_add_(0, index, update)

    # --------------------------------------------------------------------------------- hooks
    def on_epoch_start(self, epoch: int) -> None:
        super().on_epoch_start(epoch)
        self._stats = torch.zeros_like(self._stats)
        self.similarity.reset()

    def on_epoch_end(self, epoch: int) -> None:
        all_reduce_sum(self._stats)
        if self.similarity.update_count:
            self.similarity.compute()  # merges the processes' sums (every process calls this) and caches

    def epoch_metrics(self) -> dict[str, float]:
        s = dict(zip(_STATS, self._stats.tolist()))
        per = lambda a, b: a / b if b else float("nan")  # noqa: E731
        similarity = ({k: float(v) for k, v in self.similarity.compute().items()} if self.similarity.update_count
                      else dict.fromkeys(IntraClassSimilarity.KEYS, float("nan")))
        return {
            "gate_fraction": per(s["gated"], s["seen"]),
            "cache_fill": len(self._cache["labels"]) / (self.num_classes * self.config.cache_min_count),
            "pool_size": per(s["pool_members"], s["pool_anchors"]),
            "intra_loss": per(s["pool_loss"], s["pool_anchors"]),
        } | similarity

    def extra_state(self) -> dict[str, Tensor]:
        return {f"cache_{k}": v for k, v in self._cache.items()}

    def load_extra_state(self, state: dict[str, Tensor]) -> None:
        cache = {k: state[f"cache_{k}"] for k in self._cache if f"cache_{k}" in state}
        if not cache:
            return
        dim, n = self.embedding_dim, len(cache.get("labels", ()))
        shapes = {k: tuple(v.shape) for k, v in cache.items()}
        if shapes != {"anchors": (n, dim), "positives": (n, dim), "labels": (n,)}:
            raise CheckpointError(f"the checkpoint's intra-class cache does not fit this model: expected "
                                  f"anchors and positives of shape (n, {dim}) and n labels, got {shapes}")
        self._cache = {k: v.float() if v.is_floating_point() else v.long() for k, v in cache.items()}


def _check_config(cfg) -> None:
    problems = []
    if not cfg.intra_weight >= 0:
        problems.append(f"method.intra_weight (λ) must be >= 0, got {cfg.intra_weight}")
    if not -1 <= cfg.margin_threshold < 1:
        problems.append(f"method.margin_threshold (δ) must lie in [-1, 1), got {cfg.margin_threshold}")
    if not cfg.cache_min_count >= 2:
        problems.append(f"method.cache_min_count must be >= 2 (an anchor needs a negative), "
                        f"got {cfg.cache_min_count}")
    if not cfg.cache_capacity >= cfg.cache_min_count:
        problems.append(f"method.cache_capacity ({cfg.cache_capacity}) must be >= method.cache_min_count "
                        f"({cfg.cache_min_count})")
    if not cfg.temperature > 0:
        problems.append(f"method.temperature must be > 0, got {cfg.temperature}")
    if problems:
        raise ConfigError("; ".join(problems))
