"""What bench_vocab_collapse.py measures with: wall and process CPU seconds of a call (or summed over calls),
the peak resident memory of a phase, and the sampling and timing of a pairwise kernel's tiles."""

from __future__ import annotations

import resource
import time


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def clocked(out: dict, key: str, fn):
    """Run ``fn``; record its wall seconds under ``key`` and its process CPU seconds under ``key + "_cpu"``."""
    cpu, start = time.process_time(), time.perf_counter()
    value = fn()
    out[key], out[key + "_cpu"] = time.perf_counter() - start, time.process_time() - cpu
    return value


class Stopwatch:
    """Wall and process CPU seconds summed over the calls it times."""

    def __init__(self):
        self.wall = self.cpu = 0.0

    def __call__(self, fn):
        cpu, start = time.process_time(), time.perf_counter()
        value = fn()
        self.wall += time.perf_counter() - start
        self.cpu += time.process_time() - cpu
        return value

    def per_million(self, out: dict, key: str, count: int) -> None:
        out[key + "_s_per_M"], out[key + "_cpu_per_M"] = self.wall / count * 1e6, self.cpu / count * 1e6


def _status_gib(field: str) -> float | None:
    try:
        with open("/proc/self/status") as status:
            line = next(line for line in status if line.startswith(field + ":"))
        return int(line.split()[1]) / 2**20
    except (OSError, StopIteration):
        return None


def peak_gib() -> float:
    """The peak resident memory since the start or the last ``reset_peak`` (Linux's VmHWM; else ru_maxrss)."""
    peak = _status_gib("VmHWM")
    return peak if peak is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def reset_peak() -> float | None:
    """Reset the peak to the resident memory now (Linux: ``5 > /proc/self/clear_refs``), so that the next
    ``peak_gib`` is one phase's; returns the resident memory now (None where this is not possible)."""
    try:
        with open("/proc/self/clear_refs", "w") as refs:
            refs.write("5")
    except OSError:
        return None
    return _status_gib("VmRSS")


class TileSampler:
    """Stands in for ``kdcollapse.metrics._pairwise._upper_tiles``: yields every tile, or ``per_call`` of them
    evenly spread, and times each tile's kernel (the consumer's work between two yields)."""

    def __init__(self, original, per_call: int | None):
        self.original, self.per_call = original, per_call
        self.wall = self.cpu = 0.0
        self.entries_run = self.entries_all = self.tiles_run = self.tiles_all = 0

    def __call__(self, num_rows: int, tile: int):
        tiles = list(self.original(num_rows, tile))

        def entries(rows: slice, cols: slice) -> int:
            return (min(rows.stop, num_rows) - rows.start) * (min(cols.stop, num_rows) - cols.start)

        self.tiles_all += len(tiles)
        self.entries_all += sum(entries(r, c) for r, c, _ in tiles)
        n = self.per_call
        if n is not None and len(tiles) > n:
            tiles = [tiles[round(i * (len(tiles) - 1) / max(n - 1, 1))] for i in range(n)]
        for rows, cols, diagonal in tiles:
            cpu, start = time.process_time(), time.perf_counter()
            yield rows, cols, diagonal
            self.wall += time.perf_counter() - start
            self.cpu += time.process_time() - cpu
            self.entries_run += entries(rows, cols)
            self.tiles_run += 1

    def report(self, out: dict, key: str) -> None:
        """Tile counts and, for ``key`` (a phase timed by ``clocked``), its value with every tile run."""
        out[key + "_tiles"] = f"{self.tiles_run} of {self.tiles_all}"
        out[key + "_tile_cpu"] = self.cpu
        if self.entries_run < self.entries_all:
            scale = self.entries_all / self.entries_run
            for suffix, spent in (("", self.wall), ("_cpu", self.cpu)):
                out[key + suffix + "_extrapolated"] = out[key + suffix] - spent + spent * scale
        self.wall = self.cpu = 0.0
        self.entries_run = self.entries_all = self.tiles_run = self.tiles_all = 0
