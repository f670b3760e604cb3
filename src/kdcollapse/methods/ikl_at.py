"""IKL-AT: adversarial training with the Improved KL divergence (DKL paper, eq. 10 and §4.1).

The KL of TRADES is replaced by IKL between the natural logits (o_m, the "teacher" side, whose
gradient is *not* stopped) and the adversarial logits (o_n), with class-wise weights w̄_y = s̄_y s̄_yᵀ
from the model's own clean probabilities at temperature T, averaged per class over the previous epoch
(:class:`ClassMeanProbabilities`; uniform in epoch 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.errors import ConfigError
from kdcollapse.losses import ikl_at_loss
from kdcollapse.methods import register_method
from kdcollapse.methods._adversarial import AdversarialConfig, AdversarialTraining
from kdcollapse.distributed import all_reduce_sum


class ClassMeanProbabilities:
    """The "global information" of IKL (DKL paper eq. 9): row y of the (K, K) table is s̄_y, the mean of
    softmax(z/T) over the samples of class y seen during the previous epoch.

    ``observe(logits, target)`` accumulates during an epoch; ``end_epoch()`` sums the accumulators over
    the processes (DDP), divides every row by its total (= its sample count, as the official code's row
    normalisation) and starts a new epoch. Before the first ``end_epoch`` every row is uniform, 1/K; a
    class without samples in an epoch keeps its previous row. Kept as plain tensors, not buffers (DDP
    would overwrite buffers with process 0's); :meth:`state` / :meth:`load_state` carry it in checkpoints.
    """

    def __init__(self, num_classes: int, temperature: float):
        if not temperature > 0:
            raise ConfigError(f"the class-weight temperature must be > 0, got {temperature}")
        self.num_classes, self.temperature = num_classes, temperature
        self.table: Tensor | None = None  # (K, K) rows in use this epoch; None: uniform
        self.sums: Tensor | None = None  # (K, K) Σ softmax(z/T) per class, this epoch

    def weights(self, like: Tensor) -> Tensor:
        """The (K, K) table on ``like``'s device."""
        if self.table is None:
            self.table = torch.full((self.num_classes, self.num_classes), 1 / self.num_classes, device=like.device)
        return self.table.to(like.device)

    @torch.no_grad()
    def observe(self, logits: Tensor, target: Tensor) -> None:
        probs = F.softmax(logits.float() / self.temperature, dim=1)
        if self.sums is None:
            self.sums = torch.zeros(self.num_classes, self.num_classes, device=logits.device)
        self.sums.index_add_(0, target, probs)

    @torch.no_grad()
    def end_epoch(self) -> None:
        if self.sums is None:  # no step this epoch (every process of a DDP run has steps)
            return
        totals = all_reduce_sum(self.sums.double())
        counts = totals.sum(1, keepdim=True)
        previous = self.weights(totals).double()
        self.table = torch.where(counts > 0, totals / counts.clamp_min(1e-300), previous).float()
        self.sums = None

    def state(self) -> dict[str, Tensor]:
        return {} if self.table is None else {"class_weights": self.table}

    def load_state(self, state: dict[str, Tensor]) -> None:
        table = state.get("class_weights")
        if table is not None and tuple(table.shape) != (self.num_classes, self.num_classes):
            raise ConfigError(f"saved class weights have shape {tuple(table.shape)}, expected "
                              f"({self.num_classes}, {self.num_classes})")
        self.table, self.sums = table, None


@register_method("ikl_at")
class IKLAT(AdversarialTraining):
    """Minimise CE(f(x), y) + IKL(f(x) → f(x')) (DKL paper eq. 10), x' the TRADES inner maximiser.

    ``mse_weight``/``ce_weight`` are the official code's ``--beta 20``/``--alpha 4`` (CIFAR-10 and -100);
    the paper's text quotes α = 20, β = 3 for CIFAR-100.
    """

    @dataclass
    class Config(AdversarialConfig):
        mse_weight: float = 20.0  # weight of the class-weighted MSE of logit differences (paper α)
        ce_weight: float = 4.0  # weight of the soft-label cross-entropy (paper β)
        class_weight_temperature: float = 4.0  # T of the clean probabilities behind the class weights

    def __init__(self, student, config, **kwargs):
        super().__init__(student, config, **kwargs)
        self.class_means = ClassMeanProbabilities(self.num_classes, config.class_weight_temperature)

    def training_loss(self, logits_natural: Tensor, logits_adversarial: Tensor, target: Tensor) -> Tensor:
        return ikl_at_loss(logits_natural, logits_adversarial, target, self.class_means.weights(logits_natural),
                           mse_weight=self.config.mse_weight, ce_weight=self.config.ce_weight)

    def observe(self, logits_natural: Tensor, target: Tensor) -> None:
        self.class_means.observe(logits_natural, target)

    def on_epoch_end(self, epoch: int) -> None:
        super().on_epoch_end(epoch)
        self.class_means.end_epoch()

    def extra_state(self) -> dict[str, Tensor]:
        return self.class_means.state()

    def load_extra_state(self, state: dict[str, Tensor]) -> None:
        self.class_means.load_state(state)
