"""Where work runs: the device resolver, process-group setup for ``torchrun`` and the few collectives the
trainer and the methods need."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from kdcollapse.errors import ConfigError


@dataclass(frozen=True)
class DistEnv:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def init_distributed(device_kind: str) -> DistEnv:
    """Join the process group that ``torchrun`` describes in the environment (no-op for one process)."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    if world_size == 1:
        return DistEnv()
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if device_kind == "cuda" else "gloo")
    return DistEnv(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")))


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """In-place sum across processes when running distributed; returns the tensor for chaining."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_ranks_ok(ok: bool) -> bool:
    """Whether ``ok`` holds on every process (a collective: every rank must call it; True alone)."""
    if not (dist.is_available() and dist.is_initialized()):
        return ok
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else None
    flag = torch.tensor([1 if ok else 0], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN)
    return bool(flag.item())


def barrier() -> None:
    if dist.is_available() and dist.is_initialized():
        dist.barrier()


def shutdown_distributed() -> None:
    """Wait for every process, then destroy the process group (a no-op for one process). Without it each
    rank tears down its connections at interpreter exit, and a rank whose peer has already gone can abort."""
    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def resolve_device(name: str | torch.device = "auto", local_rank: int = 0, *, option: str = "device") -> torch.device:
    """``auto`` → ``cuda`` when a GPU is present, else ``cpu``; a bare ``cuda`` → this process's GPU
    (``local_rank``) made current. ``option`` names the setting in the error for CUDA without a GPU.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{option} asks for CUDA but no GPU is available; use {option}=cpu")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device
