"""Multi-level logit distillation, MLKD (Jin et al., CVPR 2023), as its official code computes it.

Two views of each image: the weak one (the loader's crop and flip) and a strong one (the same plus
RandAugment(2) and Cutout, ``strong_views``). Instance level: KD at five temperatures on both views;
batch level: the B×B sample correlations; class level: the K×K class correlations
(:func:`~kdcollapse.losses.batch_correlation_loss`, :func:`~kdcollapse.losses.class_correlation_loss`),
the last two on the weak view. The official ``KD_ours.forward_train`` (Jin-Ying/Multi-Level-Logit-
Distillation) is followed term by term, including what its code does beyond the paper's text:

- the "confidence masks" (teacher confidence at or below its batch median, for samples; the same for
  the class sums) multiply a batch-mean loss and are then averaged, so they scale each term by the
  fraction of samples (classes) at or below the median (about ½) rather than select samples;
- the strong-view KD sum uses the weak view at temperatures 2 and 6;
- the strong-view batch and class terms are computed but not added to the loss, so they are not here.

The student's logits on the weak view are its training logits. Memory: two student and two teacher
forward passes per step, as the official code.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import batch_correlation_loss, class_correlation_loss, kd_loss
from kdcollapse.methods import TeacherRequest, register_method
from kdcollapse.methods._distill import Distiller, check_config, loss, standardized

OTHER_TEMPERATURES = (3.0, 5.0, 2.0, 6.0)  # fixed in the official code, after the configured one


def below_median_fraction(values: torch.Tensor) -> torch.Tensor:
    """mean(values ≤ median): the official mask ``values.le(np.percentile(values, 50))`` averaged
    (``np.percentile`` and ``torch.quantile`` both interpolate linearly)."""
    return (values <= torch.quantile(values.detach().float(), 0.5)).float().mean()


def equals(m, x, y):
    """ce_weight·(CE_weak + CE_strong) + kd_weight·(instance kd terms + class_correlation + batch_correlation
    terms at the five temperatures), gated by the below-median fractions of the teacher's confidences."""
    cfg, (weak, strong) = m.config, x.unbind(1)
    s_w, s_s, t_w, t_s = m.student(weak), m.student(strong), m.teacher_logits(weak), m.teacher_logits(strong)
    p_t = torch.softmax(t_w, dim=1)
    sample, klass = below_median_fraction(p_t.max(dim=1).values), below_median_fraction(p_t.sum(dim=0))
    taus = (cfg.temperature, *OTHER_TEMPERATURES)

    def kd(s, t, tau):
        return loss("kd")(*standardized(cfg, s, t), tau)

    instance = (sample * sum(kd(s_w, t_w, tau) for tau in taus) + sum(kd(s_s, t_s, tau) for tau in taus[:3])
                + sum(kd(s_w, t_w, tau) for tau in taus[3:]))
    cc = klass * sum(loss("class_correlation")(s_w, t_w, tau) for tau in taus)
    bc = sample * sum(loss("batch_correlation")(s_w, t_w, tau) for tau in taus)
    return cfg.ce_weight * (m.cross_entropy(s_w, y) + m.cross_entropy(s_s, y)) + cfg.kd_weight * (instance + cc + bc)


@register_method("mlkd", equals=equals, checks=({"logit_standardization": True},))
class MLKD(Distiller):
    """ce_weight·(CE_weak + CE_strong) + kd_weight·(instance + batch + class terms), see the module docstring.

    Defaults: the official CIFAR-100 config (``KD.TEMPERATURE`` 4, ``CE_WEIGHT`` 0.1, ``KD_WEIGHT`` 0.9;
    ImageNet: 1, 0.5, 0.5). With ``logit_standardization`` the KD terms (not the correlation terms)
    z-score both logits first, as the logit-standardization authors' MLKD (they then use temperature 2 and
    kd_weight 9). Logged parts: ``ce``, ``kd``, ``cc``, ``bc`` (weighted; they sum to ``loss``).
    """

    views = 2
    strong_views = True

    teacher_reads = TeacherRequest()  # every logit, at several temperatures, and the teacher's confidences

    @dataclass
    class Config:
        temperature: float = 4.0  # the first of the five KD temperatures (the others: 3, 5, 2, 6)
        ce_weight: float = 0.1
        kd_weight: float = 0.9
        logit_standardization: bool = False  # z-score the KD terms' logits (Sun et al. 2024)

        def __post_init__(self):
            check_config(self, positive=("temperature",), non_negative=("ce_weight", "kd_weight"))

    def forward(self, x, y):
        if x.dim() < 3 or x.shape[1] != 2:
            raise KdcollapseError(f"mlkd needs a weak and a strong view per image, x of shape (B, 2, ...); "
                                  f"got {tuple(x.shape)} (the trainer's loader gives them: views=2)")
        cfg = self.config
        weak, strong = x[:, 0], x[:, 1]
        s_w, s_s = self.student(weak), self.student(strong)  # two passes, as the official code
        t_w, t_s = self.teacher_logits(weak), self.teacher_logits(strong)
        p_t = torch.softmax(t_w, dim=1)
        sample_fraction = below_median_fraction(p_t.max(dim=1).values)
        class_fraction = below_median_fraction(p_t.sum(dim=0))
        temperatures = (cfg.temperature, *OTHER_TEMPERATURES)

        def kd(s, t, tau):
            return kd_loss(*standardized(cfg, s, t), tau)

        kd_weak = sum(kd(s_w, t_w, tau) for tau in temperatures) * sample_fraction
        kd_strong = sum(kd(s_s, t_s, tau) for tau in temperatures[:3]) + sum(kd(s_w, t_w, tau)
                                                                             for tau in temperatures[3:])
        cc = sum(class_correlation_loss(s_w, t_w, tau) for tau in temperatures) * class_fraction
        bc = sum(batch_correlation_loss(s_w, t_w, tau) for tau in temperatures) * sample_fraction
        parts = {"ce": cfg.ce_weight * (self.cross_entropy(s_w, y) + self.cross_entropy(s_s, y)),
                 "kd": cfg.kd_weight * (kd_weak + kd_strong), "cc": cfg.kd_weight * cc,
                 "bc": cfg.kd_weight * bc}
        return {"loss": sum(parts.values()), "logits": s_w, **parts}
