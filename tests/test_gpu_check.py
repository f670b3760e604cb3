"""benchmarks/gpu_check.py cannot rot: its --cpu-smoke mode (the same code as on a GPU, tiny models, float32 on
the CPU) runs here; on a CUDA machine `python benchmarks/gpu_check.py` runs the full check (docs/training.md)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_check.py"


def gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_cpu_smoke_of_three_kinds_of_method_the_trainer_ddp_and_the_lm_path(tmp_path, capsys):
    # kd (deterministic), crd (seeded draws: "stochastic"), mlkd (two views); compile, fit, DDP and LM included
    assert gpu_check().main(["--cpu-smoke", "--only", "kd", "crd", "mlkd", "--out", str(tmp_path / "r.md")]) == 0
    report = (tmp_path / "r.md").read_text()
    assert report.count("| yes |") == 3 and "| crd |" in report and "stochastic" in report
    for row in ("fit vanilla", "fit kd", "one-process DDP kd", "one-process DDP dhkd", "LM token KD"):
        assert f"run: {row}" in report
    assert report.rstrip().endswith("0 failed")


def test_a_wrong_loss_fails_the_check(monkeypatch):
    """A device loss that differs from the float64 one is reported as a failure (exit 1)."""
    module = gpu_check()
    loss_of = module.loss_of
    monkeypatch.setattr(module, "loss_of", lambda m, x, y, i, device, dtype, seed=0:
                        loss_of(m, x, y, i, device, dtype, seed) * (1.01 if x.dtype != module.torch.float64 else 1))
    assert module.main(["--cpu-smoke", "--only", "kd", "--no-compile"]) == 1


def test_without_a_gpu_the_full_check_is_a_one_line_error(capsys):
    module = gpu_check()
    if module.torch.cuda.is_available():
        pytest.skip("a CUDA device is present")
    assert module.main([]) == 2
    assert capsys.readouterr().err.startswith("error: no CUDA device")


@pytest.mark.heavy
def test_cpu_smoke_of_every_registered_method():
    assert gpu_check().main(["--cpu-smoke", "--no-compile"]) == 0
