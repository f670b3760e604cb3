"""Contrastive Representation Distillation (Tian, Krishnan & Isola, ICLR 2020) with mdistiller's defaults.

loss = ce_weight·CE(z_s, y) + crd_weight·(L_NCE(student anchor, teacher memory) + L_NCE(teacher anchor,
student memory)) on the penultimate features h_s, h_t, each mapped by its own linear embedding head to
``feat_dim`` and L2-normalised (:class:`Embed`). The two memory banks hold one row per training sample
(``num_samples`` rows, the whole training set, global under DDP) and are the method's buffers: in the
checkpoint, absent from the model file. Each step draws, for every sample, ``num_negatives`` rows of samples
of other classes (without replacement, as mdistiller's CIFAR sampler, or with it, as its ImageNet sampler)
and, with ``mode: relax``, its positive row from a random sample of its own class (``exact``: its own row),
from torch's random stream, which the trainer reseeds from (seed, epoch, rank) every epoch, so a resumed run
draws the same rows. After the losses the rows of the batch's samples move towards the new embeddings
(:func:`kdcollapse.losses.crd_memory_update`); under DDP the indices and embeddings of every process are
gathered first, so every process applies the same update to the same bank.

The sampler reads the label of every training sample from ``train_labels`` (given at construction, as
mdistiller's ``CIFAR100InstanceSample`` builds its per-class index lists before training), so it draws as the
official dataset does from the first step on. The normalising constants Z of the two directions are fixed at
the first step, as in the official code, from the global batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kdcollapse.distributed import all_gather_cat, all_reduce_sum, world_size
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.losses import crd_log_scores, crd_memory_update, crd_nce_loss, crd_normalizer
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, check_config, loss


class Embed(nn.Module):
    """Linear map to ``dim_out`` followed by L2 normalisation (official ``Embed``)."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.linear(x.flatten(1).to(self.linear.weight.dtype)), dim=1)


MODES = ("exact", "relax")  # mdistiller's CFG.CRD.MODE


def equals(m, x, y, *, index):
    """ce_weight·CE + crd_weight·(crd(e_s(h_s), memory_t rows) + crd(e_t(h_t), memory_s rows)) at the drawn rows
    (the positive, then the method's sampled negatives) with the first step's normalisers."""
    cfg, h = m.config, m.student.forward_features(x)
    teacher = m.read_teacher(x)
    v_s, v_t = m.embed_student(h), m.embed_teacher(teacher.features)
    positive = index if cfg.mode == "exact" else m.sample_positives(y)
    idx = torch.cat([positive[:, None], m.sample_negatives(y)], dim=1)
    (z_s, z_t), n = m.normalizers.tolist(), m.num_samples
    crd = (loss("crd")(v_s, m.memory_teacher[idx], n, z_s, cfg.temperature)
           + loss("crd")(v_t, m.memory_student[idx], n, z_t, cfg.temperature))
    return cfg.ce_weight * m.cross_entropy(m.student.forward_head(h), y) + cfg.crd_weight * crd


@register_method("crd", equals=equals, checks=({"mode": "relax", "num_negatives": 8},))
class CRD(Distiller):
    """CE + CRD's two-way NCE loss against momentum memory banks of the whole training set."""

    needs_index = True

    teacher_reads = TeacherRequest(features=True)

    @dataclass
    class Config:
        ce_weight: float = 1.0
        crd_weight: float = 0.8  # mdistiller CRD.LOSS.FEAT_WEIGHT
        feat_dim: int = 128  # embedding dimension
        num_negatives: int = 16384  # K, negatives per sample (NCE.K)
        temperature: float = 0.07  # τ (NCE.TEMPERATURE)
        momentum: float = 0.5  # memory update (NCE.MOMENTUM)
        replacement: bool = False  # draw negatives with replacement (mdistiller's ImageNet sampler)
        mode: str = "exact"  # the positive row: the sample's own (exact) or a random same-class one (relax)

        def __post_init__(self):
            check_config(self, positive=("feat_dim", "num_negatives", "temperature"),
                         non_negative=("ce_weight", "crd_weight"))
            if not 0.0 <= self.momentum <= 1.0:
                raise ConfigError(f"method.momentum must be in [0, 1], got {self.momentum}")
            if self.mode not in MODES:
                raise ConfigError(f"method.mode must be one of {', '.join(MODES)}, got {self.mode!r}")

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        if self.train_labels is None:
            raise ConfigError("method 'crd' keeps a memory bank of the training set and draws negatives by label: "
                              "build it with train_labels=<the (N,) labels of the training set>")
        num_samples = self.num_samples
        counts = torch.bincount(self.train_labels, minlength=self.num_classes)
        if int((counts > 0).sum()) < 2:
            raise ConfigError("method 'crd' draws negatives from other classes; the training set has one class")
        d = config.feat_dim
        self.embed_student = Embed(self.student.feature_dim, d)
        self.embed_teacher = Embed(self.teacher.model.feature_dim, d)
        # The official initialisation: uniform in [-1/sqrt(d/3), 1/sqrt(d/3)] (rows of expected norm 1).
        bound = 1.0 / math.sqrt(d / 3)
        generator = torch.Generator().manual_seed(0)
        for name in ("memory_student", "memory_teacher"):
            self.register_buffer(name, torch.rand(num_samples, d, generator=generator) * 2 * bound - bound)
        # The label of every sample, and the samples grouped by class (mdistiller's cls_positive lists, one
        # after the other): class c is by_class[start[c] : start[c] + count[c]]. Functions of the data, so
        # not in the checkpoint.
        self.register_buffer("labels", self.train_labels, persistent=False)
        self.register_buffer("by_class", torch.argsort(self.train_labels, stable=True), persistent=False)
        self.register_buffer("count", counts, persistent=False)
        self.register_buffer("start", counts.cumsum(0) - counts, persistent=False)
        self.register_buffer("normalizers", torch.full((2,), -1.0))  # Z of (student anchor, teacher anchor)

    def forward(self, x: Tensor, y: Tensor, *, index: Tensor) -> dict[str, Tensor]:
        cfg = self.config
        features = self.student.forward_features(x)
        logits = self.student.forward_head(features)
        teacher = self.read_teacher(x)
        v_s = self.embed_student(features)
        v_t = self.embed_teacher(teacher.features)
        if not torch.equal(self.labels[index], y):
            raise KdcollapseError("crd: the batch's labels differ from train_labels at its indices; the indices must "
                                  "name rows of the training set whose labels the method was built with")
        all_index, all_s, all_t = (all_gather_cat(t) for t in (index, v_s.detach(), v_t.detach()))
        positive = index if cfg.mode == "exact" else self.sample_positives(y)
        idx = torch.cat([positive[:, None], self.sample_negatives(y)], dim=1)  # (B, 1 + K), positive first
        scores_s, scores_t = self.log_scores(v_s, self.memory_teacher, idx), self.log_scores(v_t, self.memory_student, idx)
        n = self.num_samples
        z_s, z_t = self.normalizers.tolist()
        if z_s < 0:  # the first step: Z of each direction, averaged over the processes
            z = torch.tensor([crd_normalizer(scores_s, n), crd_normalizer(scores_t, n)], dtype=torch.float64)
            z = all_reduce_sum(z.to(x.device)) / world_size()
            if torch.isfinite(z).all():  # else the losses below name the non-finite scores
                self.normalizers.copy_(z)
            z_s, z_t = z.tolist()
        nce = crd_nce_loss(scores_s, n, z_s) + crd_nce_loss(scores_t, n, z_t)
        with torch.no_grad():
            self.memory_student[all_index] = crd_memory_update(self.memory_student[all_index], all_s, cfg.momentum)
            self.memory_teacher[all_index] = crd_memory_update(self.memory_teacher[all_index], all_t, cfg.momentum)
        ce = cfg.ce_weight * self.cross_entropy(logits, y)
        crd = cfg.crd_weight * nce
        return {"loss": ce + crd, "logits": logits, "ce": ce.detach(), "crd": crd.detach()}

    def log_scores(self, anchors: Tensor, memory: Tensor, idx: Tensor) -> Tensor:
        """m_i · v / τ at the drawn rows ``idx`` (B, 1 + K) of ``memory``. Gathering the rows costs
        B·(1 + K)·d, scoring the whole bank B·N·d: the second when the bank is the smaller (tiny data sets).
        Either way autograd keeps a copy, not the bank, which is updated in place after the losses."""
        if self.num_samples <= idx.shape[1]:
            return (anchors @ memory.to(anchors.dtype, copy=True).T).gather(1, idx) / self.config.temperature
        return crd_log_scores(anchors, memory[idx], self.config.temperature)

    def sample_positives(self, y: Tensor) -> Tensor:
        """(B,) indices of a uniformly drawn sample of each row's class (``mode: relax``; it may be the
        row's own sample, as the official ``np.random.choice(cls_positive[target])``)."""
        pick = (torch.rand(len(y), device=y.device, dtype=torch.float64) * self.count[y]).long()
        return self.by_class[self.start[y] + pick]

    def sample_negatives(self, y: Tensor) -> Tensor:
        """(B, K) indices of samples whose label differs from each row's ``y``.

        Without replacement (a uniform K-subset) unless ``replacement`` is set or the row's class leaves fewer
        than K other samples, where the official sampler also draws that row with replacement."""
        k, n = self.config.num_negatives, self.num_samples
        others = n - self.count[y]  # (B,) candidates of each row
        with_replacement = torch.ones_like(y, dtype=torch.bool) if self.config.replacement else others < k
        idx = torch.empty(len(y), k, dtype=torch.long, device=y.device)
        rows = (~with_replacement).nonzero().flatten()
        if len(rows):
            keys = torch.rand(len(rows), n, device=y.device).masked_fill_(self.labels[None, :] == y[rows, None], -1.0)
            idx[rows] = keys.topk(k, dim=1).indices
        rows = with_replacement.nonzero().flatten()
        if len(rows):
            # Uniform over the samples of the other classes: a position among the n - count[c] of them,
            # moved past class c's block of by_class.
            c = y[rows, None]
            pos = (torch.rand(len(rows), k, device=y.device, dtype=torch.float64) * others[rows, None]).long()
            idx[rows] = self.by_class[pos + self.count[c] * (pos >= self.start[c])]
        return idx
