"""ikl_loss (O(B·K) centred variance form) vs the official B×K×K form, forward + backward on CPU.

Times are medians over --runs calls, both forms measured in this one process, and the printed ratio
compares them. Peak memory is measured per case in a fresh subprocess: the growth of the resident
set during one call (Linux VmHWM, reset just before the call, minus the RSS then). The sequence
case (B·T = 4096 positions, K = 32,000) runs only the O(B·K) form: the B×K×K tensor alone would
need 4096·32000²·4 bytes = 16.8 TB.

    OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_ikl.py --runs 5 \
        --markdown results/benchmarks/bench_ikl.md
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from loss_references import ikl_pairwise  # noqa: E402  (the official B×K×K form, also the test oracle)

from _timing import median_seconds, shared_machine  # noqa: E402  (benchmarks/_timing.py)
from kdcollapse.losses import ikl_loss  # noqa: E402
from kdcollapse.losses._shapes import check_values  # noqa: E402

CASES = [  # (label, leading shape, K, forms)
    ("B=256, K=100", (256,), 100, ("ikl", "pairwise")),
    ("B=256, K=1000", (256,), 1000, ("ikl", "pairwise")),
    ("B·T=8·512, K=32000", (8, 512), 32000, ("ikl",)),
]
MSE_WEIGHT, CE_WEIGHT, TEMPERATURE = 8.0, 1.0, 4.0  # a CIFAR-100 recipe (res32x4 → res8x4)


def make_inputs(lead: tuple[int, ...], k: int) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    student, teacher = (3 * torch.randn(2, *lead, k, generator=gen)).unbind()
    return student.requires_grad_(), teacher


def make_step(form: str, lead: tuple[int, ...], k: int):
    """A closure running one forward + backward with the sample-wise (teacher softmax) weights."""
    student, teacher = make_inputs(lead, k)

    def step() -> None:
        student.grad = None
        if form == "ikl":
            loss = ikl_loss(student, teacher, mse_weight=MSE_WEIGHT, ce_weight=CE_WEIGHT,
                            temperature=TEMPERATURE)
        else:
            loss = ikl_pairwise(student, teacher, torch.softmax(teacher, -1), MSE_WEIGHT, CE_WEIGHT,
                                TEMPERATURE)
        loss.backward()

    return step


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        return int(re.search(rf"{field}:\s+(\d+) kB", f.read()).group(1)) / 1024


def peak_mib(form: str, lead: tuple[int, ...], k: int) -> float:
    """Run in a fresh process: the resident set's peak growth during one call (Linux VmHWM, reset to
    the current RSS just before the call by writing 5 to /proc/self/clear_refs)."""
    make_step(form, (2,), 8)()  # load the code paths on tiny inputs
    step = make_step(form, lead, k)
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    before = _status_mib("VmRSS")
    step()
    return _status_mib("VmHWM") - before


def measure_memory(form: str, lead: tuple[int, ...], k: int) -> float:
    cmd = [sys.executable, __file__, "--memory", json.dumps([form, list(lead), k])]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return float(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="timed calls per form and case")
    parser.add_argument("--markdown", type=Path, help="write the result table here")
    parser.add_argument("--memory", help=argparse.SUPPRESS)  # internal: one memory measurement
    args = parser.parse_args()
    if args.memory:
        form, lead, k = json.loads(args.memory)
        print(peak_mib(form, tuple(lead), k))
        return

    load_before = os.getloadavg()[0]
    rows = []
    for label, lead, k, forms in CASES:
        result = {"case": label}
        for form in forms:
            result[form] = median_seconds(make_step(form, lead, k), args.runs)
            result[form + "_mem"] = measure_memory(form, lead, k)
            print(f"{label:>20}  {form:>8}: {1e3 * result[form]:9.1f} ms   "
                  f"peak +{result[form + '_mem']:.1f} MiB", flush=True)
        student, teacher = make_inputs(lead, k)
        result["check"] = median_seconds(lambda: check_values({"s": student, "t": teacher}), args.runs)
        print(f"{label:>20}  input validation (NaN/inf): {1e3 * result['check']:.1f} ms = "
              f"{100 * result['check'] / result['ikl']:.1f}% of the O(B·K) call", flush=True)
        if "pairwise" in result:
            result["speedup"] = result["pairwise"] / result["ikl"]
            result["mem_ratio"] = result["pairwise_mem"] / max(result["ikl_mem"], 1e-9)
            print(f"{label:>20}  O(B·K) is {result['speedup']:.1f}x faster, "
                  f"uses {result['mem_ratio']:.1f}x less memory", flush=True)
        rows.append(result)
    if args.markdown:
        args.markdown.write_text(render(rows, args.runs, (load_before, os.getloadavg()[0])))


def render(rows: list[dict], runs: int, load: tuple[float, float]) -> str:
    lines = [
        "| case | O(B·K) ikl_loss | B×K×K form | speed-up | O(B·K) peak | B×K×K peak | NaN/inf check |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        pair = "pairwise" in r
        lines.append(
            f"| {r['case']} | {1e3 * r['ikl']:.1f} ms | "
            + (f"{1e3 * r['pairwise']:.1f} ms | **{r['speedup']:.0f}×** | " if pair else "— | — | ")
            + f"{r['ikl_mem']:.1f} MiB | "
            + (f"{r['pairwise_mem']:.1f} MiB | " if pair else "16.8 TB (not run) | ")
            + f"{1e3 * r['check']:.2f} ms ({100 * r['check'] / r['ikl']:.1f}%) |")
    return "\n".join([
        "# ikl_loss: O(B·K) variance form vs the B×K×K form",
        "",
        shared_machine(load) + ", float32.",
        f"Command: `OMP_NUM_THREADS={torch.get_num_threads()} PYTHONPATH=src python "
        f"benchmarks/bench_ikl.py --runs {runs} --markdown results/benchmarks/bench_ikl.md`",
        f"Forward + backward of the whole IKL loss (wMSE + soft CE, sample-wise weights, mse_weight "
        f"{MSE_WEIGHT}, ce_weight {CE_WEIGHT}, τ = {TEMPERATURE}); median of {runs} timed calls after "
        "one warm-up, both forms in one process. Peak = growth of the resident set during one call "
        "(Linux VmHWM, reset just before the call through /proc/self/clear_refs, minus the RSS then) "
        "in a fresh subprocess per cell; the inputs, allocated before, are not counted. NaN/inf "
        "check = the input validation every loss call runs (one sum per input), timed alone, as a "
        "share of the O(B·K) call.",
        "",
        *lines,
        "",
        "The other jobs on the shared machine inflate absolute times; each ratio compares calls made "
        "in one process under the same load. The sequence case's peak is about six tensors of the "
        "inputs' size (4096 × 32000 float32 = 500 MiB each); the B×K×K form is not run there.",
        "",
    ])


if __name__ == "__main__":
    main()
