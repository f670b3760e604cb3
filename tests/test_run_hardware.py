"""run.json names the machine a run was trained on (issue 43, item 6): CPU model and torch CPU capability (float
results are bit-exact only within a CPU family), the GPU if any, and the torch, CUDA and cuDNN versions."""

import json
from pathlib import Path

import torch

from kdcollapse.distributed import hardware, machine
from kdcollapse.train import fit


def cpuinfo_model() -> str | None:
    path = Path("/proc/cpuinfo")
    lines = path.read_text().splitlines() if path.exists() else []
    return next((line.split(":", 1)[1].strip() for line in lines if line.startswith("model name")), None)


def test_run_json_records_the_hardware(tmp_path, tiny_config):
    fit(tiny_config(tmp_path / "run", "train.epochs=1", "train.device=cpu"))
    record = json.loads((tmp_path / "run" / "run.json").read_text())["hardware"]
    assert record == json.loads(json.dumps(hardware()))
    assert record["cpu_capability"].split(" + ")[0] == torch.backends.cpu.get_cpu_capability()
    assert record["cpu"] == (cpuinfo_model() or record["cpu"]) and record["cpu"]
    assert record["torch"] == torch.__version__ and record["cuda"] == torch.version.cuda
    assert record["gpu"] == (torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)
    assert record["cpu"] in machine() and record["cpu_capability"] in machine()
