"""Training cost of every distillation method relative to KD: time per step and activation memory.

    PYTHONPATH=src nice -n 10 python benchmarks/bench_kd_methods_cost.py                 # both settings
    PYTHONPATH=src python benchmarks/bench_kd_methods_cost.py --settings cifar --rounds 3 \\
        --out results/benchmarks/kd_methods_cost.md

Settings: resnet32x4 -> resnet8x4 on 3x32x32 inputs, 100 classes (the DHKD paper's Table 10 pair, batch 64),
ResNet34 -> ResNet18 on 3x224x224 inputs, 1000 classes (the DKL paper's Table 3 pair), and convnet ->
convnet_small on 1x28x28 inputs, 10 classes (the Fashion-MNIST recipes, batch 64: the method table of
results/distillation/method_table/). Each method is
built from its committed recipe for that pair (configs/cifar100/<method>/resnet32x4_resnet8x4.yaml,
configs/imagenet/<method>/resnet34_resnet18.yaml, configs/fashion_mnist/<method>.yaml), so it runs with the official hyper-parameters (CRD with a
memory bank of the training set's size: 50,000 or 1,281,167 rows), with randomly initialised networks. A step
is what the trainer does: the forward with the teacher pass, the method's ``backward``, one SGD step. Methods
are interleaved: every round times one step of each, in a shuffled order, so a change of machine load hits
them alike; ratios to KD are taken within each round and their median reported.

Memory: the bytes autograd saves for the backward pass (unique storages, parameters and buffers excluded),
measured with ``torch.autograd.graph.saved_tensors_hooks`` in a separate untimed step: the activation memory
that dominates a GPU's peak during training, deterministic and machine-independent (the CPU allocator keeps
no peak counter). The method's own parameters (connectors, heads, ABF blocks) and buffers (CRD's memory
banks) are listed beside it, as the DHKD paper's Table 10 counts "# params".
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import time
from pathlib import Path

import torch
import yaml

from kdcollapse.config import method_config
from kdcollapse.methods import FrozenTeacher, build_method, list_methods
from kdcollapse.models import create_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _timing import machine, shared_machine  # noqa: E402

CONFIGS = Path(__file__).resolve().parents[1] / "configs"
SETTINGS = {  # teacher, student, image size, classes, training-set size, recipe area and stem, default batch
    "cifar": ("resnet32x4", "resnet8x4", 32, 100, 50_000, "cifar100", "resnet32x4_resnet8x4", 64),
    "imagenet": ("resnet34", "resnet18", 224, 1000, 1_281_167, "imagenet", "resnet34_resnet18", 8),
    "fashion_mnist": ("convnet", "convnet_small", 28, 10, 60_000, "fashion_mnist", None, 64),  # recipe: area/<name>.yaml
    # the K = 100 task: two images side by side (H x W = 28 x 56), 100 pair classes, 60,000 training pairs
    "fashion_mnist_pairs": ("convnet", "convnet_small", (28, 56), 100, 60_000, "fashion_mnist_pairs", None, 64),
}
CHANNELS = {"fashion_mnist": 1, "fashion_mnist_pairs": 1}  # else 3
LABELS = {"kd": "KD", "dkd": "DKD", "ikl_kd": "IKL-KD", "dhkd": "DHKD", "rkd": "RKD", "fitnet": "FitNet",
          "at": "AT", "ofd": "OFD", "dist": "DIST", "crd": "CRD", "reviewkd": "ReviewKD", "vid": "VID",
          "nst": "NST", "sp": "SP", "pkt": "PKT", "ce_binarykl": "BinaryKL", "nkd": "NKD", "wttm": "WTTM",
          "ctkd": "CTKD", "mlkd": "MLKD", "kd_ls": "KD + LS", "dkd_ls": "DKD + LS", "ctkd_ls": "CTKD + LS",
          "mlkd_ls": "MLKD + LS"}  # the *_ls names are recipes only (logit standardization on), timed where present
# Published costs. DHKD Table 10 (ms per batch of 64, RTX 3090, resnet32x4 -> resnet8x4); DKL Table 3 (s per
# iteration, 4 RTX 3090, batch 512, ResNet34 -> ResNet18).
PAPER = {"cifar": {"KD": 11, "RKD (defaults)": 25, "FitNet": 14, "OFD": 19, "CRD": 41, "ReviewKD": 26, "DKD": 11,
                   "DHKD (no alignment)": 14, "DHKD": 21},
         "imagenet": {"IKL-KD": 197, "ReviewKD": 319}, "fashion_mnist": {}, "fashion_mnist_pairs": {}}
PAPER_BASE = {"cifar": "KD", "imagenet": "IKL-KD", "fashion_mnist": "KD", "fashion_mnist_pairs": "KD"}  # the DKL paper gives no KD time


def sections(area: str, stem: str) -> dict[str, dict]:
    """label -> method section: the committed recipe of this pair where there is one, else the method's
    defaults (label marked "defaults"), for every registered method of LABELS."""
    out = {}
    registered = set(list_methods())
    for name, label in LABELS.items():
        recipe = CONFIGS / area / (f"{name}.yaml" if stem is None else f"{name}/{stem}.yaml")
        if recipe.is_file():
            out[label] = yaml.safe_load(recipe.read_text())["method"]
        elif name in registered:
            out[f"{label} (defaults)"] = {"name": name}
    if "DHKD" in out and out["DHKD"].get("alignment", "off") != "off":  # the paper times both
        out = {**out, "DHKD (no alignment)": {**out["DHKD"], "alignment": "off"}}
    return out


def hw(size) -> tuple[int, int]:
    """A setting's image size as (H, W): one number for square images."""
    return tuple(size) if isinstance(size, tuple) else (size, size)


def build(section: dict, setting: tuple, teacher: FrozenTeacher, labels: torch.Tensor):
    _, student_name, _, k, n, area, *_ = setting
    torch.manual_seed(0)
    student = create_model(student_name, k, CHANNELS.get(area, 3))
    method = build_method(method_config(section), student, num_classes=k, teacher=teacher,
                          num_samples=n, train_labels=labels)
    method.on_epoch_start(30)  # past every warm-up (20 epochs at most), before DHKD's ImageNet cut-off at 50
    optimizer = torch.optim.SGD([p for p in method.parameters() if p.requires_grad], lr=0.01, momentum=0.9)
    return method.train(), optimizer


def views(method, x: torch.Tensor) -> torch.Tensor:
    """The batch as the trainer's loader gives it to ``method``: (B, 2, ...) for a two-view method (MLKD's
    weak and strong views; here the same images twice: the strong augmentation runs in the loader, untimed)."""
    return x.unsqueeze(1).expand(-1, 2, *x.shape[1:]).contiguous() if getattr(method, "views", 1) == 2 else x


def step(method, optimizer, x, y, index) -> None:
    x = views(method, x)
    optimizer.zero_grad(set_to_none=True)
    out = method(x, y, index=index) if getattr(method, "needs_index", False) else method(x, y)
    method.backward(out, lambda loss: loss)
    optimizer.step()


def saved_bytes(method, x, y, index) -> int:
    """Bytes of the unique storages autograd saves in one forward (parameters and buffers excluded)."""
    own = {t.untyped_storage().data_ptr() for t in [*method.parameters(), *method.buffers()]}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in own:
            seen[storage.data_ptr()] = storage.nbytes()
        return t

    x = views(method, x)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = method(x, y, index=index) if getattr(method, "needs_index", False) else method(x, y)
    del out
    return sum(seen.values())


def extra_sizes(method) -> tuple[int, int]:
    """(trainable parameters outside the student, buffer elements outside the student)."""
    student = {id(p) for p in [*method.student.parameters(), *method.student.buffers()]}
    params = sum(p.numel() for p in method.parameters() if p.requires_grad and id(p) not in student)
    buffers = sum(b.numel() for b in method.buffers() if id(b) not in student)
    return params, buffers


def run_setting(name: str, args) -> dict:
    setting = SETTINGS[name]
    teacher_name, _, size, k, n, area, stem, default_batch = setting
    batch = (args.imagenet_batch_size if name == "imagenet" else None) or args.batch_size or default_batch
    torch.manual_seed(0)
    channels = CHANNELS.get(name, 3)
    teacher = FrozenTeacher(create_model(teacher_name, k, channels))
    x = torch.randn(batch, channels, *hw(size))
    labels = torch.randint(0, k, (n,))  # the training set's labels (CRD's sampler draws by them)
    index = torch.randperm(n)[:batch]
    y = labels[index]
    runs = {label: build(section, setting, teacher, labels) for label, section in sections(area, stem).items()}
    memory = {label: saved_bytes(method, x, y, index) for label, (method, _) in runs.items()}
    sizes = {label: extra_sizes(method) for label, (method, _) in runs.items()}
    wall: dict[str, list[float]] = {label: [] for label in runs}
    cpu: dict[str, list[float]] = {label: [] for label in runs}
    rng = random.Random(0)
    for round_ in range(args.warmup + args.rounds):
        order = list(runs)
        rng.shuffle(order)
        for label in order:
            method, optimizer = runs[label]
            start, start_cpu = time.perf_counter(), time.process_time()
            step(method, optimizer, x, y, index)
            if round_ >= args.warmup:
                wall[label].append(time.perf_counter() - start)
                cpu[label].append(time.process_time() - start_cpu)
        print(f"{name}: round {round_ + 1}/{args.warmup + args.rounds} done", file=sys.stderr)
    return {"wall": wall, "cpu": cpu, "memory": memory, "sizes": sizes, "batch": batch}


def ratio(times: dict[str, list[float]], label: str, base: str) -> float:
    """Median over rounds of (this method's step) / (the base method's step in the same round)."""
    return statistics.median(t / b for t, b in zip(times[label], times[base]))


def render_setting(name: str, r: dict, args) -> list[str]:
    teacher, student, size, k, n, *_ = SETTINGS[name]
    wall, cpu, memory, sizes = r["wall"], r["cpu"], r["memory"], r["sizes"]
    paper, base = PAPER[name], PAPER_BASE[name]
    lines = [f"## {teacher} -> {student}, batch {r['batch']}, {CHANNELS.get(name, 3)}x{'x'.join(map(str, hw(size)))}, "
             f"{k} classes",
             "",
             "| method | ms / step (median) | time vs KD | CPU time vs KD | saved activations (MB) | memory vs KD "
             f"| extra params | extra buffers | paper: time vs {base} |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label in sorted(wall, key=lambda lb: statistics.median(wall[lb])):
        p = paper.get(label)
        paper_cell = f"{p / paper[base]:.2f} ({p} ms)" if p is not None and base in paper else ""
        params, buffers = sizes[label]
        lines.append(f"| {label} | {1000 * statistics.median(wall[label]):.0f} | {ratio(wall, label, 'KD'):.2f} | "
                     f"{ratio(cpu, label, 'KD'):.2f} | {memory[label] / 2**20:.1f} | "
                     f"{memory[label] / memory['KD']:.2f} | {params / 1e6:.3f}M | {buffers / 1e6:.2f}M | {paper_cell} |")
    if "IKL-KD" in wall and "ReviewKD" in wall:
        t = ratio(wall, "IKL-KD", "ReviewKD")
        lines += ["", f"IKL-KD / ReviewKD step time: {t:.2f} (wall), {ratio(cpu, 'IKL-KD', 'ReviewKD'):.2f} (CPU "
                  f"time): IKL-KD costs {100 * (1 - t):.0f} % less per step here"
                  + ("; the DKL paper: 0.197 / 0.319 = 0.62 (38 % less)." if name == "imagenet" else ".")]
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--settings", default="cifar,imagenet",
                        help="comma-separated: cifar, imagenet, fashion_mnist, fashion_mnist_pairs")
    parser.add_argument("--rounds", type=int, default=3, help="timed rounds (median over them)")
    parser.add_argument("--warmup", type=int, default=1, help="untimed rounds first")
    parser.add_argument("--batch-size", type=int, default=None, help="default: 64 (cifar), 8 (imagenet)")
    parser.add_argument("--imagenet-batch-size", type=int, default=None, help="overrides --batch-size for imagenet")
    parser.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    parser.add_argument("--out", default=None, help="also write the markdown report here")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    load_start = os.getloadavg()[0]
    results = {name: run_setting(name, args) for name in args.settings.split(",")}
    load_end = os.getloadavg()[0]
    body = [line for name, r in results.items() for line in [*render_setting(name, r, args), ""]]
    command = "PYTHONPATH=src python benchmarks/bench_kd_methods_cost.py " + " ".join(sys.argv[1:])
    report = "\n".join([
        "# Training cost of the distillation methods relative to KD (measured output)", "",
        f"{args.rounds} timed rounds after {args.warmup} warm-up round(s), methods interleaved in a shuffled order "
        "per round; ratios are medians over rounds of per-round ratios. Saved activations: bytes autograd keeps "
        "for the backward pass of one step (see the script's docstring).", "",
        *body,
        f"- {shared_machine((load_start, load_end))}",
        f"- {machine(torch.device('cpu'))}",
        f"- command: `{command.strip()}`", ""])
    print(report)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
