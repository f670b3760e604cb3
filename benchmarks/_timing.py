"""What the speed benchmarks share: timers, medians and interleaved rounds, and the line that names the machine
they ran on."""

from __future__ import annotations

import importlib.util
import os
import platform
import random
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from kdcollapse.distributed import cpu_capability  # e.g. "AVX512 + avx512_bf16"


def timer(fn: Callable[[], object], cpu: bool = False) -> Callable[[], float]:
    """A timer for :func:`interleave`: the seconds of one call of ``fn``, wall or (``cpu``) this process's CPU."""
    clock = time.process_time if cpu else time.perf_counter

    def run() -> float:
        start = clock()
        fn()
        return clock() - start
    return run


def median_seconds(fn: Callable[[], object], runs: int, cpu: bool = False, warm_up: bool = True) -> float:
    """Median seconds (wall, or ``cpu`` time) of ``runs`` calls of ``fn``, after one untimed call if ``warm_up``."""
    if warm_up:
        fn()
    run = timer(fn, cpu)
    return statistics.median(run() for _ in range(runs))


def interleave(timers: dict[str, Callable[[], float]], rounds: int, seed: int = 0) -> dict[str, float]:
    """Median of what each timer returns (seconds) over ``rounds`` rounds, each round in a shuffled order."""
    times: dict[str, list[float]] = {name: [] for name in timers}
    rng = random.Random(seed)
    for _ in range(rounds):
        order = list(timers)
        rng.shuffle(order)
        for name in order:
            times[name].append(timers[name]())
    return {name: statistics.median(v) for name, v in times.items()}


def machine(device: torch.device) -> str:
    """Processor, cores, torch, threads, and the GPU used, or that none was (and whether one is present)."""
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "no GPU used" + (
        "" if torch.cuda.is_available() else " (none present)")
    return (f"{cpu_model()}, {os.cpu_count()} cores, torch {torch.__version__}, "
            f"{torch.get_num_threads()} threads, device {device} ({gpu}), CPU capability {cpu_capability()}")


def cpu_model() -> str:
    """The processor's model name, from /proc/cpuinfo or else ``lscpu`` (else the platform's word for it)."""
    def named(lines: list[str]) -> str | None:
        return next((line.split(":", 1)[1].strip() for line in lines if line.startswith(("model name", "Model name"))),
                    None)

    info = Path("/proc/cpuinfo")
    found = named(info.read_text().splitlines()) if info.is_file() else None
    if found is None:
        try:
            found = named(subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout.splitlines())
        except (OSError, subprocess.SubprocessError):
            pass
    return found or platform.processor() or platform.machine() or "unknown"


def emit(text: str, markdown: Path | None) -> None:
    """Print a benchmark's page and, with ``--markdown PATH``, write it there too (its folder made)."""
    print(text)
    if markdown:
        markdown.parent.mkdir(parents=True, exist_ok=True)
        markdown.write_text(text)


def shared_machine(load: tuple[float, float]) -> str:
    """The "Machine: ..." sentence of a results page: processor, cores, the 1-minute load average at the start
    and at the end of the benchmark, torch threads and version."""
    return (f"Machine: {cpu_model()} ({os.cpu_count()} cores, CPU capability {cpu_capability()}, shared: 1-minute "
            f"load average {load[0]:.1f} at the start, {load[1]:.1f} at the end), torch threads: "
            f"{torch.get_num_threads()}, torch {torch.__version__}")


def revision_module(revision: str, path: str):
    """The module ``src/kdcollapse/<path>`` of git ``revision``, loaded beside this tree's (its own imports of
    kdcollapse resolve to this tree)."""
    source = subprocess.run(["git", "show", f"{revision}:src/kdcollapse/{path}"], check=True, capture_output=True,
                            text=True, cwd=os.path.dirname(os.path.abspath(__file__))).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as file:
        file.write(source)
    spec = importlib.util.spec_from_file_location("baseline_" + path.replace("/", "_")[:-3], file.name)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    os.unlink(file.name)
    return module
