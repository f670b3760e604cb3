"""Where work runs and in what precision: the device resolver, the autocast precision, process-group setup
for ``torchrun`` and the few collectives the trainer and the methods need."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

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


def is_main_process() -> bool:
    """Whether this process reports results: rank 0 of the process group, or of ``torchrun``'s environment
    before the group exists; True for a single process."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank() == 0
    return int(os.environ.get("RANK", "0")) == 0


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """In-place sum across processes when running distributed; returns the tensor for chaining."""
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def world_size() -> int:
    """The number of processes in the group (1 without one)."""
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def all_gather_cat(tensor: torch.Tensor) -> torch.Tensor:
    """The tensors of every process concatenated along dim 0, in rank order (the tensor itself alone).

    Ranks may hold different numbers of rows (a last, shorter batch): rows are padded to the largest count
    for the collective and trimmed after it. Carries no gradient."""
    if not (dist.is_available() and dist.is_initialized()):
        return tensor
    count = torch.tensor([tensor.shape[0]], device=tensor.device)
    counts = [torch.zeros_like(count) for _ in range(dist.get_world_size())]
    dist.all_gather(counts, count)
    sizes = [int(c) for c in counts]
    padded = tensor.new_zeros((max(sizes), *tensor.shape[1:]))
    padded[: tensor.shape[0]] = tensor
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded.contiguous())
    return torch.cat([part[:size] for part, size in zip(parts, sizes)])


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


# How long a rank that failed waits for its peers before leaving anyway (gloo only): they may be blocked in
# another collective, and they fail as soon as this process has gone.
FAILURE_WAIT = timedelta(seconds=10)


def shutdown_distributed(failed: bool = False) -> None:
    """Leave the process group together: a barrier, then ``destroy_process_group`` (no-op without a group).

    Without it a rank can leave while collectives are still in flight (its own, or a peer's that needs
    it), and the gloo threads finish them during interpreter finalization; a C++ thread that then needs
    the GIL is ended by CPython with ``pthread_exit``, which aborts the process ("terminate called
    without an active exception"). After the barrier nothing is in flight; ``gc.collect()`` then frees
    objects in reference cycles that hold the group (a DDP module's reducer), so its threads are joined
    now, not at finalization. ``failed=True`` (this rank is leaving on an error) waits at most
    ``FAILURE_WAIT`` (gloo) or not at all (NCCL), because the peers may never reach the barrier.
    """
    if not (dist.is_available() and dist.is_initialized()):
        return
    try:
        if not failed:
            dist.barrier()
        elif dist.get_backend() == "gloo":
            dist.monitored_barrier(timeout=FAILURE_WAIT)
    except RuntimeError:  # DistBackendError: a peer has gone or is stuck elsewhere; the original error counts
        if not failed:
            raise
    finally:
        dist.destroy_process_group()
        gc.collect()


@contextmanager
def distributed_teardown() -> Iterator[None]:
    """Run a block of distributed work, then :func:`shutdown_distributed` on every exit path.

    The one teardown used by the command line and by the multi-process tests::

        dist.init_process_group("gloo", rank=rank, world_size=2)
        with distributed_teardown():
            ...
    """
    try:
        yield
    except BaseException:
        shutdown_distributed(failed=True)
        raise
    shutdown_distributed()


def resolve_device(name: str | torch.device = "auto", local_rank: int = 0, *, option: str = "device") -> torch.device:
    """``auto`` → ``cuda`` when a GPU is present, else ``cpu``; a bare ``cuda`` → this process's GPU
    (``local_rank``) made current. ``option`` names the setting in the error for CUDA without a GPU.

    >>> resolve_device("cpu")
    device(type='cpu')
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda", "mps"):
        raise ConfigError(f"{option} must be auto, cpu, cuda, cuda:N or mps, got {name!r}")
    if device.type == "mps" and not (hasattr(torch.backends, "mps") and torch.backends.mps.is_available()):
        raise ConfigError(f"{option}={name}: no Apple GPU (MPS) is available; use {option}=cpu")
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ConfigError(f"{option} asks for CUDA but no GPU is available; use {option}=cpu")
        if device.index is None:
            device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    return device


PRECISIONS = {"off": None, "auto": "auto", "bf16": torch.bfloat16, "fp16": torch.float16}
# What a bf16 training step cost against float32 where bf16 is emulated (AVX2 kernels, no avx512_bf16 / AMX):
# ratios in one process, results/benchmarks/speed.md ("bf16 by CPU capability").
EMULATED_BF16_COST = "a KD step measured 3.8x (small CNN) to 12x slower than float32"
_warned: set[str] = set()
_log = logging.getLogger(__name__)


def cpu_capability() -> str:
    """The CPU's vector capability as torch reports it, with its native bf16 units: e.g. ``"AVX512 + avx512_bf16"``,
    ``"AVX2"``. Every speed figure of the project names it.

    >>> cpu_capability().split()[0] in {"AVX512", "AVX2", "DEFAULT", "NO", "ZVECTOR", "VSX", "SVE256", "SVE"}
    True
    """
    units = [name for name, check in (("avx512_bf16", "_is_avx512_bf16_supported"), ("amx", "_is_amx_tile_supported"))
             if _cpu_check(check)]
    return " + ".join([torch.backends.cpu.get_cpu_capability(), *units])


def hardware() -> dict:
    """What a run or a page's numbers were computed on: the CPU's model name (``/proc/cpuinfo``, else the
    platform's machine name) and :func:`cpu_capability`, the GPU (``None`` without CUDA), and the torch,
    CUDA and cuDNN versions. Bit-exactness holds only within a CPU family (MKL and oneDNN choose their kernels
    by CPU), so ``run.json`` records it.

    >>> sorted(hardware())
    ['cpu', 'cpu_capability', 'cuda', 'cudnn', 'gpu', 'torch']
    """
    import platform
    from pathlib import Path

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    cudnn = torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None
    return {"cpu": cpu, "cpu_capability": cpu_capability(), "gpu": gpu, "torch": torch.__version__,
            "cuda": torch.version.cuda, "cudnn": cudnn}


def machine() -> str:
    """Where a computation ran, for a page's records: :func:`hardware` in words, with the Python version."""
    import platform

    h = hardware()
    gpu = f", GPU {h['gpu']} (CUDA {h['cuda']})" if h["gpu"] else ""
    return (f"{h['cpu']} (torch CPU capability {h['cpu_capability']}){gpu}, torch {h['torch']}, "
            f"Python {platform.python_version()}")


def _cpu_check(name: str) -> bool:
    check = getattr(torch.cpu, name, None)  # private torch helpers: absent means "not known", i.e. no
    try:
        return bool(check()) if check is not None else False
    except RuntimeError:
        return False


def native_bf16(device: torch.device) -> bool:
    """Whether ``device`` computes bf16 natively: a CPU whose kernels torch dispatches at AVX-512 with
    AVX-512 BF16 or AMX, a GPU that supports bf16. Elsewhere bf16 is emulated and slower than float32."""
    if device.type == "cpu":
        return torch.backends.cpu.get_cpu_capability() in ("AVX512", "AMX") and (
            _cpu_check("_is_avx512_bf16_supported") or _cpu_check("_is_amx_tile_supported"))
    return device.type == "cuda" and torch.cuda.is_bf16_supported()


def resolve_precision(name: str, device: torch.device, *, option: str = "precision") -> torch.dtype | None:
    """The autocast dtype that ``name`` (off | auto | bf16 | fp16) asks for on ``device``; ``None`` for off.

    ``auto`` is bf16 where ``device`` computes it natively (:func:`native_bf16`), else float32. A precision
    that cannot be honoured is an error, never silently dropped: fp16 needs CUDA (its gradient scaler and
    fast kernels are CUDA's), bf16 a CPU or a GPU that supports it. bf16 asked for on a CPU without native
    bf16 instructions is honoured, with a one-line warning (once per option) of what it costs.

    >>> resolve_precision("off", torch.device("cpu")) is None
    True
    >>> resolve_precision("auto", torch.device("cpu")) is (torch.bfloat16 if native_bf16(torch.device("cpu")) else None)
    True
    """
    if name not in PRECISIONS:
        raise ConfigError(f"{option} must be one of {', '.join(PRECISIONS)}, got {name!r}")
    dtype = PRECISIONS[name]
    if dtype == "auto":
        return torch.bfloat16 if device.type in ("cpu", "cuda") and native_bf16(device) else None
    if dtype is None:
        return None
    if device.type not in ("cpu", "cuda"):
        raise ConfigError(f"{option}={name} runs on cpu or cuda, not {device.type}; use {option}=off")
    if dtype is torch.float16 and device.type != "cuda":
        raise ConfigError(f"{option}=fp16 needs a CUDA device; on the CPU use {option}=bf16 or {option}=off")
    if dtype is torch.bfloat16 and device.type == "cuda" and not torch.cuda.is_bf16_supported():
        raise ConfigError(f"{option}=bf16: this GPU does not support bfloat16; use {option}=fp16 or off")
    if dtype is torch.bfloat16 and device.type == "cpu" and not native_bf16(device) and option not in _warned:
        _warned.add(option)
        _log.warning(f"{option}=bf16: torch's CPU kernels here ({cpu_capability()}) have no native bf16 (AVX512 with avx512_bf16 or AMX), "
                     f"so bf16 is emulated, {EMULATED_BF16_COST}; {option}=auto or off uses float32 here")
    return dtype


def autocast(device: torch.device, dtype: torch.dtype | None):
    """``torch.autocast`` to ``dtype`` on ``device``, or nothing for ``dtype=None`` (float32)."""
    if dtype is None:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype)
