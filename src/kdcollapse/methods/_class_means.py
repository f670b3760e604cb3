"""The "global information" of IKL (DKL paper eq. 9), shared by ``ikl_kd`` and ``ikl_at``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from kdcollapse.distributed import all_reduce_sum
from kdcollapse.errors import CheckpointError, ConfigError


class ClassMeanProbabilities:
    r"""Row y of the (K, K) table is s̄_y, the mean of softmax(z/T) over the samples of class y seen in
    the previous epoch, renormalised to sum to 1 (DKL paper eq. 9); IKL weights the pair (j, k) of a
    sample of class y by s̄_y^j·s̄_y^k.

    ``observe(logits, target)`` accumulates float64 sums and counts during an epoch; ``end_epoch()``
    sums them over the processes (DDP), replaces every row seen this epoch by its mean — or blends,
    row ← m·mean + (1 − m)·row for ``momentum`` m < 1 — and starts a new epoch. Before the first
    ``end_epoch`` every row is uniform, 1/K; a class without samples in an epoch keeps its row. Plain
    tensors, not buffers (DDP would overwrite buffers with process 0's at every forward): :meth:`state`
    and :meth:`load_state` carry them in checkpoints.

    >>> means = ClassMeanProbabilities(3, temperature=1.0)
    >>> means.observe(torch.tensor([[0.0, 0.0, 0.0], [2.0, 0.0, 0.0]]), torch.tensor([0, 2]))
    >>> means.end_epoch()
    >>> [round(v, 4) for v in means.table[0].tolist()], [round(v, 4) for v in means.table[1].tolist()]
    ([0.3333, 0.3333, 0.3333], [0.3333, 0.3333, 0.3333])
    >>> [round(v, 4) for v in means.table[2].tolist()]
    [0.787, 0.1065, 0.1065]
    """

    # Checkpoint keys (``extra.<key>``), as ``ikl_kd`` has always written them.
    KEYS = ("class_weights", "class_weight_sums", "class_weight_counts")

    def __init__(self, num_classes: int, temperature: float, momentum: float = 1.0):
        if not temperature > 0:
            raise ConfigError(f"the class-weight temperature must be > 0, got {temperature}")
        if not 0 < momentum <= 1:
            raise ConfigError(f"the class-weight momentum must be in (0, 1], got {momentum}")
        k = num_classes
        self.num_classes, self.temperature, self.momentum = k, temperature, momentum
        self.table = torch.full((k, k), 1.0 / k)  # rows in use this epoch (float32)
        self.sums = torch.zeros(k, k, dtype=torch.float64)  # Σ softmax(z/T) per class, this epoch
        self.counts = torch.zeros(k, dtype=torch.float64)  # samples per class, this epoch

    def weights(self, like: Tensor) -> Tensor:
        """The (K, K) table on ``like``'s device."""
        self._to(like.device)
        return self.table

    @torch.no_grad()
    def observe(self, logits: Tensor, target: Tensor) -> None:
        """Add a batch of (B, K) logits (teacher's or model's) with their (B,) classes."""
        self._to(logits.device)
        probs = F.softmax(logits.float() / self.temperature, dim=1).double()
        self.sums.index_add_(0, target, probs)
        self.counts.index_add_(0, target, torch.ones_like(target, dtype=torch.float64))

    @torch.no_grad()
    def end_epoch(self) -> None:
        """New rows from this epoch's sums, all-reduced over the processes; then reset the sums."""
        sums, counts = all_reduce_sum(self.sums.clone()), all_reduce_sum(self.counts.clone())
        means = sums / counts.clamp_min(1)[:, None]
        means = means / means.sum(1, keepdim=True).clamp_min(torch.finfo(means.dtype).tiny)
        old = self.table.to(means)
        new = torch.where((counts > 0)[:, None], means, old)  # a class absent this epoch keeps its row
        m = self.momentum
        self.table = (m * new + (1 - m) * old).to(self.table.dtype)
        self.sums.zero_()
        self.counts.zero_()

    def state(self) -> dict[str, Tensor]:
        return dict(zip(self.KEYS, (self.table, self.sums, self.counts)))

    def load_state(self, state: dict[str, Tensor]) -> None:
        """Restore :meth:`state`. The table is required; the sums and counts (always zero at an epoch
        end, absent from checkpoints of ``ikl_at`` before they were shared) default to zero."""
        current = self.state()
        for key in self.KEYS:
            value = state.get(key)
            if value is None and key != "class_weights":
                continue
            if value is None or value.shape != current[key].shape:
                got = "missing" if value is None else f"shape {tuple(value.shape)}"
                raise CheckpointError(
                    f"IKL class-mean state '{key}' in the checkpoint is {got}; expected shape "
                    f"{tuple(current[key].shape)} (a checkpoint of the same method with the same classes)"
                )
            current[key] = value.to(current[key].dtype)
        self.table, self.sums, self.counts = (current[key] for key in self.KEYS)

    def _to(self, device: torch.device) -> None:
        if any(t.device != device for t in (self.table, self.sums, self.counts)):
            self.table, self.sums, self.counts = (t.to(device) for t in (self.table, self.sums, self.counts))
