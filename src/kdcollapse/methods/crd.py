"""Contrastive Representation Distillation (Tian, Krishnan & Isola, ICLR 2020) with mdistiller's defaults.

loss = ce_weight·CE(z_s, y) + crd_weight·(L_NCE(student anchor, teacher memory) + L_NCE(teacher anchor,
student memory)) on the penultimate features h_s, h_t, each mapped by its own linear embedding head to
``feat_dim`` and L2-normalised (:class:`Embed`). The two memory banks hold one row per training sample
(``num_samples`` rows, the whole training set, global under DDP) and are the method's buffers: in the
checkpoint, absent from the model file. Each step draws, for every sample, ``num_negatives`` rows of samples
of other classes (without replacement, as mdistiller's CIFAR sampler, or with it, as its ImageNet sampler)
from torch's random stream, which the trainer reseeds from (seed, epoch, rank) every epoch, so a resumed run
draws the same negatives. After the losses the rows of the batch's samples move towards the new embeddings
(:func:`kdcollapse.losses.crd_memory_update`); under DDP the indices and embeddings of every process are
gathered first, so every process applies the same update to the same bank.

The sampler needs the label of every training sample; the method learns them as it sees each sample (a
buffer of ``num_samples`` labels, −1 until seen). In the first epoch a sample not seen yet may be drawn as a
negative of its own class; from the second epoch on the negatives are exactly those of the official sampler.
The normalising constants Z of the two directions are fixed at the first step, as in the official code, from
the global batch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from kdcollapse.distributed import all_gather_cat, all_reduce_sum, world_size
from kdcollapse.errors import ConfigError
from kdcollapse.losses import crd_log_scores, crd_memory_update, crd_nce_loss, crd_normalizer
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, check_config


class Embed(nn.Module):
    """Linear map to ``dim_out`` followed by L2 normalisation (official ``Embed``)."""

    def __init__(self, dim_in: int, dim_out: int):
        super().__init__()
        self.linear = nn.Linear(dim_in, dim_out)

    def forward(self, x: Tensor) -> Tensor:
        return F.normalize(self.linear(x.flatten(1).to(self.linear.weight.dtype)), dim=1)


@register_method("crd")
class CRD(Distiller):
    """CE + CRD's two-way NCE loss against momentum memory banks of the whole training set."""

    needs_index = True

    @classmethod
    def teacher_request(cls, config):
        return TeacherRequest(features=True)

    @dataclass
    class Config:
        ce_weight: float = 1.0
        crd_weight: float = 0.8  # mdistiller CRD.LOSS.FEAT_WEIGHT
        feat_dim: int = 128  # embedding dimension
        num_negatives: int = 16384  # K, negatives per sample (NCE.K)
        temperature: float = 0.07  # τ (NCE.TEMPERATURE)
        momentum: float = 0.5  # memory update (NCE.MOMENTUM)
        replacement: bool = False  # draw negatives with replacement (mdistiller's ImageNet sampler)

        def __post_init__(self):
            check_config(self, positive=("feat_dim", "num_negatives", "temperature"),
                         non_negative=("ce_weight", "crd_weight"))
            if not 0.0 <= self.momentum <= 1.0:
                raise ConfigError(f"method.momentum must be in [0, 1], got {self.momentum}")

    def __init__(self, student, config, *, num_classes, num_samples=None, **kwargs):
        super().__init__(student, config, num_classes=num_classes, num_samples=num_samples, **kwargs)
        if num_samples is None:
            raise ConfigError("method 'crd' keeps a memory bank of the training set: build it with num_samples=N")
        d = config.feat_dim
        self.embed_student = Embed(self.student.feature_dim, d)
        self.embed_teacher = Embed(self.teacher.model.feature_dim, d)
        # The official initialisation: uniform in [-1/sqrt(d/3), 1/sqrt(d/3)] (rows of expected norm 1).
        bound = 1.0 / math.sqrt(d / 3)
        generator = torch.Generator().manual_seed(0)
        for name in ("memory_student", "memory_teacher"):
            self.register_buffer(name, torch.rand(num_samples, d, generator=generator) * 2 * bound - bound)
        self.register_buffer("labels", torch.full((num_samples,), -1, dtype=torch.long))
        self.register_buffer("normalizers", torch.full((2,), -1.0))  # Z of (student anchor, teacher anchor)

    def forward(self, x: Tensor, y: Tensor, *, index: Tensor) -> dict[str, Tensor]:
        cfg = self.config
        features = self.student.forward_features(x)
        logits = self.student.forward_head(features)
        teacher = self.read_teacher(x)
        v_s = self.embed_student(features)
        v_t = self.embed_teacher(teacher.features)
        all_index, all_y, all_s, all_t = (all_gather_cat(t) for t in (index, y, v_s.detach(), v_t.detach()))
        self.labels[all_index] = all_y
        idx = torch.cat([index[:, None], self.sample_negatives(y)], dim=1)  # (B, 1 + K), positive first
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

    def sample_negatives(self, y: Tensor) -> Tensor:
        """(B, K) indices of samples whose known label differs from each row's ``y`` (unseen ones count).

        Without replacement (a uniform K-subset) unless ``replacement`` is set or some row has fewer than K
        candidates, where the official sampler also switches to drawing with replacement."""
        k, n = self.config.num_negatives, self.num_samples
        if not self.config.replacement:
            same = self.labels[None, :] == y[:, None]  # (B, N)
            if k <= n - int(same.sum(1).max()):
                keys = torch.rand(len(y), n, device=y.device).masked_fill_(same, -1.0)
                return keys.topk(k, dim=1).indices
        idx = torch.randint(n, (len(y), k), device=y.device)
        for _ in range(100):  # redraw same-class picks; each round keeps about 1/C of them
            bad = self.labels[idx] == y[:, None]
            if not bad.any():
                break
            idx = torch.where(bad, torch.randint(n, idx.shape, device=y.device), idx)
        return idx
