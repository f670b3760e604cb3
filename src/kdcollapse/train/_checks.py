"""The image trainer's checks: the first batch before the run directory changes, finite losses and weights
before an epoch is committed, and processes in sync under ``torchrun``. A mixin of
:class:`kdcollapse.train._trainer.Trainer` (its attributes: ``cfg``, ``method``, ``teacher``, ``train_loader``,
``run_dir``, ``precision``, ``to_layout``; ``kept`` and ``TrainingDiverged`` are the run engine's)."""

from __future__ import annotations

import copy
import math

import torch

from kdcollapse.distributed import all_ranks_ok
from kdcollapse.errors import ConfigError
from kdcollapse.train._engine import TrainingDiverged


class TrainerChecks:
    def check_first_batch(self) -> None:
        """The method's forward (student and teacher) on the first training batch, before the run directory
        changes: a model that cannot take the data, or a loss that is not finite before any step (e.g. an
        infinite weight), is a ``ConfigError`` that leaves nothing behind. It runs on a copy of the method
        (sharing the frozen teacher), so weights, buffers and caches stay as they are; every epoch reseeds."""
        loader = self.train_loader
        loader.set_epoch(0)
        x, y = next(iter(loader))
        index = loader.batch_index(0)
        if self.teacher is not None:
            self.teacher.select(index)
        probe = copy.deepcopy(self.method, memo={} if self.teacher is None else {id(self.teacher): self.teacher})
        probe.on_epoch_start(0)
        try:
            with self.precision():
                out = probe(self.to_layout(x), y, **({"index": index} if probe.needs_index else {}))
            loss = float(out["loss"].detach().float())
        except (RuntimeError, ValueError, TypeError, IndexError) as err:
            first = (str(err).strip().splitlines() or [type(err).__name__])[0]
            raise ConfigError(f"the first training batch of shape {tuple(x.shape)} fails in model "
                              f"'{self.cfg.model.name}' / method '{self.cfg.method.name}': {first}; check "
                              "model.kwargs and the method's settings") from None
        finally:
            del probe
        if not math.isfinite(loss):
            raise ConfigError(f"the loss of the first training batch is {loss} before any step; check the method's "
                              f"weights and temperature (method.* of method '{self.cfg.method.name}')")

    def check_finite(self, loss_sum: torch.Tensor, epoch: int, step: int) -> None:
        if not torch.isfinite(loss_sum).item():
            where = f"epoch {epoch + 1}, step {step + 1} (global step {epoch * len(self.train_loader) + step + 1})"
            hint = self.method.divergence_hint
            raise TrainingDiverged(
                f"the training loss became {loss_sum.item()} at or before {where}; {self.kept()}. "
                + (f"{hint}. " if hint else "") + "Lower optim.lr, set optim.grad_clip, or check the data"
            )

    @torch.no_grad()
    def check_epoch_is_good(self, epoch: int, record: dict) -> None:
        """An epoch is saved only with finite weights and a finite test loss: the loss check of the training
        steps misses a blow-up in an epoch's last step, which would save 3e38 weights as a good checkpoint."""
        state = {k: v for k, v in self.method.state_dict().items() if v.is_floating_point()}
        finite = torch.stack([torch.isfinite(v).all() for v in state.values()]).cpu().tolist()
        bad = next((name for name, ok in zip(state, finite) if not ok), None)
        loss = record.get("test_loss", 0.0)
        if all_ranks_ok(bad is None and math.isfinite(loss)):
            return
        what = (f"the weights ({bad}) are not finite" if bad else f"the test loss is {loss}" if not math.isfinite(loss)
                else "another process found non-finite weights")
        raise TrainingDiverged(
            f"after epoch {epoch + 1} {what}; that epoch was not saved, {self.kept()}. "
            "Lower optim.lr, set optim.grad_clip, or check the data"
        )

    @torch.no_grad()
    def ranks_in_sync(self) -> bool:
        """Whether every process holds the same parameters (DDP keeps them equal; this checks it)."""
        sums = torch.stack([torch.stack([p.double().sum(), p.double().square().sum()])
                            for p in self.method.parameters()]).flatten()
        low, high = sums.clone(), sums.clone()
        torch.distributed.all_reduce(low, op=torch.distributed.ReduceOp.MIN)
        torch.distributed.all_reduce(high, op=torch.distributed.ReduceOp.MAX)
        return bool(torch.equal(low, high))

