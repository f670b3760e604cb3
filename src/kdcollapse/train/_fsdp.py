"""FSDP2 for ``kdcollapse distill-lm`` (``distributed.strategy: fsdp`` under ``torchrun``).

Each decoder layer of the student is sharded with ``torch.distributed.fsdp.fully_shard`` over all processes
(gloo on the CPU): its parameters, gradients and AdamW moments are split along dim 0, gathered for its
forward and backward, and its gradients reduce-scattered (averaged over processes). The embeddings, the final
norm and the output head stay whole on every process: the fused head loss uses the head's weight outside the
model's forward, where a sharded weight would not be gathered; their gradients are all-reduced as DDP would.

A commit gathers the whole student and optimizer state (a collective: every process takes part) and the main
process writes it in the one-process checkpoint format, so ``checkpoint.safetensors`` and ``state.json`` are
those of any run and a run can be resumed with either strategy. A resume loads the whole tensors on every
process and keeps each one's shard. The main process evaluates and exports a whole copy of the student.
A LoRA student (``student.lora``) is sharded the same way, its frozen base weights and its adapter alike: a
commit keeps the adapter's tensors of the gathered state, and the export merges the adapter of the whole copy.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor, distribute_tensor

from kdcollapse import lm
from kdcollapse.errors import ConfigError, KdcollapseError


def decoder_layers(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The student's decoder layers (:func:`kdcollapse.lm.decoder_layers`), each one FSDP unit."""
    try:
        return list(lm.decoder_layers(model)[1])
    except KdcollapseError as err:
        raise ConfigError(f"distributed.strategy=fsdp: {err}") from None


class Sharded:
    """A student sharded layer by layer; :attr:`whole` (main process) an unsharded copy for evaluation and
    export, refreshed by :meth:`gather`."""

    def __init__(self, model: torch.nn.Module, world_size: int, is_main: bool, whole: torch.nn.Module | None = None):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        self.whole = (whole if whole is not None else copy.deepcopy(model)) if is_main else None
        mesh = init_device_mesh("cpu", (world_size,))
        for layer in decoder_layers(model):
            fully_shard(layer, mesh=mesh, reshard_after_forward=True)
        self.model, self.world_size = model, world_size

    def local_parameters(self) -> int:
        """How many parameter values this process holds (its shards and the replicated parameters)."""
        return sum((p.to_local() if isinstance(p, DTensor) else p).numel() for p in self.model.parameters())

    # ------------------------------------------------------------------------------- training
    def average_replicated_gradients(self) -> None:
        """All-reduce (mean) the gradients of the unsharded parameters; the shards' came reduce-scattered."""
        for p in self.model.parameters():
            if p.grad is not None and not isinstance(p.grad, DTensor):
                dist.all_reduce(p.grad)
                p.grad.div_(self.world_size)

    def clip_grad_norm_(self, max_norm: float) -> None:
        """``torch.nn.utils.clip_grad_norm_`` over the whole gradient: the norm of the sharded gradients
        summed across processes, of the replicated ones counted once."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        sharded = sum((g.to_local().float().pow(2).sum() for g in grads if isinstance(g, DTensor)), torch.zeros(()))
        dist.all_reduce(sharded)
        whole = sum((g.float().pow(2).sum() for g in grads if not isinstance(g, DTensor)), torch.zeros(()))
        total = (sharded + whole).sqrt()
        coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
        for g in grads:
            (g.to_local() if isinstance(g, DTensor) else g).mul_(coef)

    # ---------------------------------------------------------------------------- commits
    def gather(self) -> dict[str, torch.Tensor]:
        """The whole state dict (every process must call it); also loaded into :attr:`whole`."""
        state = {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in self.model.state_dict().items()}
        if self.whole is not None:
            self.whole.load_state_dict(state)
        return state

    def gather_optimizer(self, optimizer: torch.optim.Optimizer) -> dict:
        """The optimizer's state dict with whole tensors (a collective), as one process would hold it."""
        state = optimizer.state_dict()
        state["state"] = {i: {k: v.full_tensor() if isinstance(v, DTensor) else v for k, v in s.items()}
                          for i, s in state["state"].items()}
        return state

    def load(self, tensors: dict[str, torch.Tensor]) -> None:
        """Whole tensors (the same on every process) into the sharded student: each keeps its shard."""
        with torch.no_grad():
            for name, p in self.model.state_dict().items():
                value = tensors[name]
                p.copy_(shard_like(value, p) if isinstance(p, DTensor) else value)
        if self.whole is not None:
            self.whole.load_state_dict(tensors)

    def shards(self, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Whole tensors of some of the student's entries (a LoRA adapter's), each as this process holds it."""
        state = self.model.state_dict()
        return {name: shard_like(value, state[name]) if isinstance(state.get(name), DTensor) else value
                for name, value in tensors.items()}

    def load_whole(self, tensors: dict[str, torch.Tensor]) -> None:
        """Some of the whole copy's entries (main process; a LoRA adapter's on resume)."""
        if self.whole is not None:
            self.whole.load_state_dict(tensors, strict=False)

    def load_optimizer(self, optimizer: torch.optim.Optimizer, state: dict) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        for i, entry in state["state"].items():
            p = params[int(i)]
            if isinstance(p, DTensor):
                entry.update({k: shard_like(v, p) for k, v in entry.items() if k != "step"})
        optimizer.load_state_dict(state)


def shard_like(value: torch.Tensor, like: DTensor) -> DTensor:
    """This process's shard of a whole tensor, laid out as ``like`` (no communication: every process holds it)."""
    return distribute_tensor(value.to(like.dtype), like.device_mesh, like.placements, src_data_rank=None)
