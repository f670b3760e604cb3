"""A GPU check in one command: every registered method and the LM loss path, a few steps each, against float64.

    PYTHONPATH=src python benchmarks/gpu_check.py --out results/benchmarks/gpu_check_<GPU>.md     # a CUDA machine, <= 8 min
    PYTHONPATH=src python benchmarks/gpu_check.py --cpu-smoke                             # the same code on CPU, tiny

On the device (``cuda``; ``--cpu-smoke``: the CPU, float32, tiny models — tests/test_gpu_check.py runs it so
the script cannot rot), for every method of ``kdcollapse.methods.list_methods()``:

* **loss vs float64**: the first step's loss under bf16 autocast with channels-last inputs and modules, against
  the same method, weights and batch in float64 on the CPU (relative error; bf16 has 8 mantissa bits, so
  ``--tol`` defaults to 0.05). A method whose loss depends on random draws (CRD's negatives, an attack's random
  start) draws differently on another device: reported as ``stochastic`` and only checked finite;
* **compiled**: the same step with ``torch.compile`` on the student (loss vs the eager bf16 step; ``--cpu-smoke``
  traces it with the ``aot_eager`` backend: the same Dynamo and AOTAutograd graphs, no C++ code generation);
* **images/s**: ``--steps`` timed steps (forward, the method's backward, SGD) against a bare loop (student and
  cross-entropy only) in the same process, as a ratio.

Then the trainer end to end: ``kdcollapse.train.fit`` on a CIFAR-100 pickle release written to a temporary folder,
with ``train.amp=bf16``, ``train.channels_last``, ``train.compile`` and the on-device loader (the whole split on
the device, batches augmented there), once alone and once as a one-process DDP group (``WORLD_SIZE=1`` is a no-op
in the trainer, so the check wraps a method in ``DistributedDataParallel`` itself and compares one step's
gradients with the unwrapped method's). Last, the LM loss path: a token-level KD step of a tiny Llama student on a
tiny Llama teacher (random weights, ``transformers``), loss vs float64 and tokens/s vs a bare next-token loop.
Every number is printed with the device's name and the CPU capability.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import gc
import math
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kdcollapse.config import load_config, method_config
from kdcollapse.distributed import machine
from kdcollapse.methods import FrozenTeacher, build_method, get_method, list_methods
from kdcollapse.models import create_model

PACKAGE = [n for n in list_methods() if get_method(n).__module__.startswith("kdcollapse.methods.")]


def models(name: str, smoke: bool, k: int):
    """(student, teacher) for ``name``: CIFAR shapes (resnet8x4 <- resnet32x4); the smoke run: 8x8 grey digits."""
    request = get_method(name).teacher_request(method_config({"name": name}))
    stages = request is not None and request.stages
    if smoke:
        make = (lambda w: create_model("convnet_small", k, in_channels=1)) if stages else \
            (lambda w: create_model("mlp", k, in_channels=1, input_size=8, hidden=(w,)))
        return make(16), (make(12) if request is not None else None)
    return create_model("resnet8x4", k), (create_model("resnet32x4", k) if request is not None else None)


def batch(method, smoke: bool, k: int, b: int, device):
    torch.manual_seed(0)
    shape = (1, 8, 8) if smoke else (3, 32, 32)
    x = torch.randn(b, *shape)
    if method.views > 1:
        x = torch.stack([x, *[x.roll(v, dims=-1) for v in range(1, method.views)]], dim=1)
    y = torch.arange(b) % k
    return x.to(device), y.to(device)


def build(name: str, smoke: bool, k: int, labels: torch.Tensor):
    torch.manual_seed(0)
    student, teacher = models(name, smoke, k)
    method = build_method(method_config({"name": name}), student, num_classes=k,
                          teacher=FrozenTeacher(teacher) if teacher is not None else None, train_labels=labels)
    method.set_input_normalization((0.5,), (0.25,))
    return method, teacher


def step(method, x, y, index, optimizer=None):
    out = method(x, y, index=index) if method.needs_index else method(x, y)
    if optimizer is not None:
        optimizer.zero_grad(set_to_none=True)
        method.backward(out, lambda loss: loss)
        optimizer.step()
    return out


def loss_of(method, x, y, index, device, dtype, seed=0):
    method.train()
    method.on_epoch_start(0)
    torch.manual_seed(seed)
    with torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
        return float(step(method, x, y, index)["loss"].detach().float())


def check_method(name: str, args, device, amp) -> dict:
    k, b = (10, 20) if args.cpu_smoke else (100, 64)
    labels = torch.arange(256) % k
    index = torch.arange(b) if get_method(name).needs_index else None
    reference, _ = build(name, args.cpu_smoke, k, labels)
    method = copy.deepcopy(reference)
    reference.double()
    if reference.teacher is not None:
        reference.teacher.to(torch.float64)
    x, y = batch(reference, args.cpu_smoke, k, b, "cpu")
    exact = loss_of(reference, x.double(), y, index, torch.device("cpu"), None)
    stochastic = exact != loss_of(copy.deepcopy(reference), x.double(), y, index, torch.device("cpu"), None, seed=1)
    method.to(device)
    layout = torch.channels_last if x.dim() == 4 and not args.cpu_smoke else torch.contiguous_format
    method.to(memory_format=layout)
    if method.teacher is not None:
        method.teacher.to(device)
    xd, yd = x.to(device).contiguous(memory_format=layout) if x.dim() == 4 else x.to(device), y.to(device)
    idx = None if index is None else index.to(device)
    got = loss_of(copy.deepcopy(method), xd, yd, idx, device, amp)
    error = abs(got - exact) / max(abs(exact), 1e-12)
    got_compiled = got
    if not args.no_compile:
        compiled = copy.deepcopy(method)
        # on the CPU (smoke) the aot_eager backend: Dynamo and AOTAutograd trace the graph the GPU compiles, without
        # Inductor's C++ code generation (~14 CPU-s cold for three methods), which a CUDA device does not use
        compiled.student.compile(backend="aot_eager" if args.cpu_smoke else "inductor")
        got_compiled = loss_of(compiled, xd, yd, idx, device, amp)
    ok = math.isfinite(got) and math.isfinite(got_compiled) and (stochastic or (
        error <= args.tol and abs(got_compiled - got) <= args.tol * max(abs(got), 1e-12)))
    return {"method": name, "float64": exact, "device": got, "rel_error": error, "compiled": got_compiled,
            "stochastic": stochastic, "ok": ok, "images_per_s": throughput(method, xd, yd, idx, device, amp, args),
            "bare_images_per_s": throughput(None, xd, yd, idx, device, amp, args, student=method.student)}


def throughput(method, x, y, index, device, amp, args, student=None) -> float:
    """Images/s of ``args.steps`` training steps (after one warm-up step); ``method=None``: the bare loop."""
    model = method if method is not None else student
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    model.train()
    if method is not None:
        method.on_epoch_start(0)
    single = x[:, 0] if x.dim() == 5 else x

    def once():
        with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
            if method is not None:
                return step(method, x, y, index, optimizer)
            loss = F.cross_entropy(student(single).float(), y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()

    once()
    sync(device)
    start = time.perf_counter()
    for _ in range(args.steps):
        once()
    sync(device)
    return args.steps * len(y) / (time.perf_counter() - start)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_trainer(args, device) -> list[dict]:
    """fit() with bf16, channels-last, compile and the on-device loader, alone, on a CIFAR-100 pickle release."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from formats import cifar_members  # the official pickle layout, shared with the tests

    from kdcollapse.train import fit

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "data" / "cifar-100-python"
        root.mkdir(parents=True)
        files, _ = cifar_members(True, per_batch=4 if args.cpu_smoke else 200)
        for name, data in files.items():
            (root / name).write_bytes(data)
        model = ["model.name=mlp", "model.kwargs={input_size: 32, hidden: [16]}"] if args.cpu_smoke else \
            ["model.name=resnet8x4"]
        precision = ["train.amp=off" if args.cpu_smoke else "train.amp=bf16",
                     f"train.compile={'false' if args.no_compile or args.cpu_smoke else 'true'}"]
        for name in ("vanilla", "kd"):
            overrides = ["data.name=cifar100", f"data.root={root.parent}", "data.batch_size=64", "train.epochs=1",
                         "train.progress=false", f"train.device={device.type}", "train.channels_last=true",
                         *precision, *model, f"run_dir={Path(tmp) / name}", f"method.name={name}"]
            if name == "kd":
                overrides.append(f"teacher.checkpoint={Path(tmp) / 'vanilla'}")
            start = time.perf_counter()
            result = fit(load_config(None, overrides))
            rows.append({"run": f"fit {name}", "seconds": time.perf_counter() - start, "test_acc": result.last_acc,
                         "ok": math.isfinite(result.last_acc)})
    return rows


def check_ddp(args, device) -> list[dict]:
    """One-process DDP: a DistributedDataParallel-wrapped method's gradients equal the plain method's."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    rows = []
    try:
        for name in ("kd", "dhkd"):
            k, b = (10, 20) if args.cpu_smoke else (100, 64)
            plain, _ = build(name, args.cpu_smoke, k, torch.arange(256) % k)
            plain.to(device)
            if plain.teacher is not None:
                plain.teacher.to(device)
            wrapped = copy.deepcopy(plain)
            ddp = DistributedDataParallel(wrapped, device_ids=[device.index] if device.type == "cuda" else None)
            x, y = batch(plain, args.cpu_smoke, k, b, device)
            grads = []
            for model, method in ((plain, plain), (ddp, wrapped)):
                method.train()
                method.on_epoch_start(0)
                out = model(x, y)
                method.zero_grad(set_to_none=True)
                method.backward(out, lambda loss: loss)
                grads.append(torch.cat([p.grad.flatten() for p in method.parameters() if p.grad is not None]))
            error = float((grads[0] - grads[1]).abs().max() / grads[0].abs().max())
            rows.append({"run": f"one-process DDP {name}", "max_rel_grad_diff": error, "ok": error < 1e-5})
            # The DDP wrapper's reducer holds the process group: freed after destroy_process_group (when this
            # function returns), gloo's destructor joined a thread that never ended (a fresh-clone CI run hung).
            del ddp, model, out
            gc.collect()
    finally:
        gc.collect()
        dist.destroy_process_group()
    return rows


def check_lm(args, device, amp) -> list[dict]:
    """Token-level KD (kdcollapse.losses.kd_loss on B x T x V logits) of a tiny Llama on a tiny Llama."""
    try:
        from transformers import LlamaConfig, LlamaForCausalLM
    except ImportError:
        return [{"run": "LM", "ok": False, "note": "transformers is not installed (pip install 'kdcollapse[llm]')"}]
    from kdcollapse.losses import kd_loss

    vocab, seq, b = (300, 16, 4) if args.cpu_smoke else (32000, 512, 8)
    hidden = 32 if args.cpu_smoke else 512

    def llama(seed, width):
        torch.manual_seed(seed)
        return LlamaForCausalLM(LlamaConfig(vocab_size=vocab, hidden_size=width, intermediate_size=2 * width,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4))

    student, teacher = llama(0, hidden), llama(1, 2 * hidden).eval()
    ids = torch.randint(vocab, (b, seq), generator=torch.Generator().manual_seed(0))

    def loss(s, t, x, dtype, dev):
        with torch.autocast(dev.type, dtype=dtype, enabled=dtype is not None):
            with torch.no_grad():
                zt = t(x).logits.float()
            return kd_loss(s(x).logits.float(), zt, temperature=1.0)

    exact = float(loss(copy.deepcopy(student).double(), copy.deepcopy(teacher).double(), ids, None, torch.device("cpu")))
    student.to(device), teacher.to(device)
    got = float(loss(student, teacher, ids.to(device), amp, device))
    optimizer = torch.optim.SGD(student.parameters(), lr=1e-3)

    def timed(kd: bool) -> float:
        x = ids.to(device)
        sync(device)
        start = time.perf_counter()
        for _ in range(args.steps):
            if kd:
                value = loss(student, teacher, x, amp, device)
            else:
                with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                    value = F.cross_entropy(student(x).logits[:, :-1].float().flatten(0, 1), x[:, 1:].flatten())
            optimizer.zero_grad(set_to_none=True)
            value.backward()
            optimizer.step()
        sync(device)
        return args.steps * b * seq / (time.perf_counter() - start)

    error = abs(got - exact) / max(abs(exact), 1e-12)
    return [{"run": "LM token KD (tiny Llama)", "float64": exact, "device": got, "rel_error": error,
             "tokens_per_s": timed(True), "bare_tokens_per_s": timed(False), "ok": error <= args.tol}]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny models on the CPU in float32 (the test's mode)")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per method (default 20; smoke 1)")
    parser.add_argument("--tol", type=float, default=None, help="relative loss error allowed (default 0.05; smoke 1e-4)")
    parser.add_argument("--only", nargs="*", default=None, help="these methods only")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile step (and in fit)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    if not args.cpu_smoke and not torch.cuda.is_available():
        print("error: no CUDA device; run on a GPU machine, or give --cpu-smoke for the CPU smoke mode", file=sys.stderr)
        return 2
    args.steps = args.steps or (1 if args.cpu_smoke else 20)
    args.tol = args.tol or (1e-4 if args.cpu_smoke else 0.05)
    device = torch.device("cpu") if args.cpu_smoke else torch.device("cuda", 0)
    amp = None if args.cpu_smoke else torch.bfloat16
    names = [n for n in PACKAGE if args.only is None or n in args.only]
    lines = [f"# gpu_check on {torch.cuda.get_device_name(0) if device.type == 'cuda' else 'CPU (smoke)'}; {machine()}",
             "", "| method | float64 CPU loss | device loss | rel. error | compiled | images/s | bare images/s | "
             "time / bare | ok |", "|---|---|---|---|---|---|---|---|---|"]
    failed = []
    for name in names:
        r = check_method(name, args, device, amp)
        failed += [] if r["ok"] else [name]
        lines.append(f"| {name} | {r['float64']:.6g} | {r['device']:.6g} | "
                     f"{'stochastic' if r['stochastic'] else format(r['rel_error'], '.2e')} | {r['compiled']:.6g} | "
                     f"{r['images_per_s']:.0f} | {r['bare_images_per_s']:.0f} | "
                     f"{r['bare_images_per_s'] / r['images_per_s']:.2f}x | {'yes' if r['ok'] else 'NO'} |")
        print(lines[-1], flush=True)
    for row in check_trainer(args, device) + check_ddp(args, device) + check_lm(args, device, amp):
        failed += [] if row["ok"] else [row["run"]]
        lines.append("- " + ", ".join(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}" for k, v in row.items()))
        print(lines[-1], flush=True)
    lines.append(f"\n{len(failed)} failed" + (f": {', '.join(failed)}" if failed else ""))
    print(lines[-1])
    if args.out is not None:
        args.out.write_text("\n".join(lines) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
