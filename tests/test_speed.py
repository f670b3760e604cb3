"""Speed options of the trainer (issue 15): bf16 autocast on the CPU, channels-last, the teacher in
inference mode and its stored logits (``teacher.cache=logits``), exact where they claim to be."""

import json
from pathlib import Path

import pytest
import torch

from kdcollapse.config import load_config
from kdcollapse.distributed import autocast, resolve_precision
from kdcollapse.errors import ConfigError, KdcollapseError
from kdcollapse.methods import FrozenTeacher
from kdcollapse.models import create_model
from kdcollapse.runs import read_metrics
from kdcollapse.train import Trainer, fit
from naming import raises_naming

# scikit-learn's digits: 8x8 grey images, always available offline.
TINY = ["data.name=digits", "data.batch_size=64", "train.progress=false", "optim.lr=0.05", "schedule.name=constant",
        "train.epochs=1"]


def tiny(path, *extra):
    return load_config(None, [*TINY, f"run_dir={path}", *extra])


@pytest.fixture(scope="module")
def teacher_run(tmp_path_factory):
    return fit(tiny(tmp_path_factory.mktemp("t") / "teacher", "model.name=convnet_small")).run_dir


def run_json(run_dir) -> dict:
    return json.loads((Path(run_dir) / "run.json").read_text())


def test_precision_that_cannot_be_honoured_is_an_error(tmp_path):
    with raises_naming(ConfigError, "train.amp=fp16", "train.amp=bf16", "train.amp=off"):
        Trainer(tiny(tmp_path / "r", "train.amp=fp16", "train.device=cpu"))
    assert not (tmp_path / "r").exists()  # refused before the run directory was made
    assert resolve_precision("off", torch.device("cpu")) is None
    with pytest.raises(ConfigError, match="must be one of off, auto, bf16, fp16"):
        resolve_precision("fp8", torch.device("cpu"))


def test_bf16_autocast_runs_on_cpu_with_float32_sums(tmp_path):
    cfg = tiny(tmp_path / "bf16", "model.name=convnet_small", "train.amp=bf16", "train.channels_last=true",
               "train.device=cpu")
    trainer = Trainer(cfg)
    trainer.train_loader.set_epoch(0)
    x, y = next(iter(trainer.train_loader))
    out = trainer.step(trainer.to_layout(x), y)
    assert out["logits"].dtype == torch.bfloat16  # autocast is on: the old trainer ignored it on CPU
    assert trainer.method.student.head.weight.dtype == torch.float32  # master weights stay float32
    assert x.is_contiguous() and trainer.to_layout(x).is_contiguous(memory_format=torch.channels_last)
    record = trainer.run()
    assert record.last_acc > 30  # it learns digits in one bf16 epoch
    facts = run_json(cfg.run_dir)
    assert (facts["precision"], facts["memory_format"], facts["compiled"]) == ("bf16", "channels_last", False)


def _loss_and_grads(cfg, amp):
    """The first batch's loss and the student's gradients, under autocast to ``amp`` (None: float32)."""
    trainer = Trainer(cfg)
    trainer.train_loader.set_epoch(0)
    x, y = next(iter(trainer.train_loader))
    method = trainer.method
    with autocast(torch.device("cpu"), amp):
        out = method(x, y)
    out["loss"].backward()
    grads = torch.cat([p.grad.flatten() for p in method.student.parameters()])
    return out["loss"].float(), grads


@pytest.mark.parametrize("model", ["convnet_small", "mlp"])
def test_bf16_loss_and_gradients_match_fp32_within_bf16_rounding(tmp_path, model):
    """What holds on every CPU, native bf16 or emulated: one batch's loss and gradients under bf16 autocast
    are float32's up to bf16 rounding (8 bits of mantissa: relative error 2^-8 per operation)."""
    extra = ["model.kwargs={input_size: 8}"] if model == "mlp" else []
    common = [f"model.name={model}", "train.device=cpu", *extra]
    loss32, grad32 = _loss_and_grads(tiny(tmp_path / "a", *common), None)
    loss16, grad16 = _loss_and_grads(tiny(tmp_path / "b", *common), torch.bfloat16)  # same seed: weights, batch
    # Measured: loss 2.4e-4 relative; gradients 0.11 (convnet_small, bf16 activations through four layers)
    # and 0.035 (mlp) relative in norm, cosine 0.994 and 0.9994, alike at AVX512 and with ATEN_CPU_CAPABILITY=avx2
    # ONEDNN_MAX_CPU_ISA=AVX2 (emulated bf16). The bounds leave room for other kernels' rounding order.
    assert loss16.item() == pytest.approx(loss32.item(), rel=1e-2)
    assert torch.nn.functional.cosine_similarity(grad16, grad32, dim=0) > 0.98
    assert (grad16 - grad32).norm() <= 0.2 * grad32.norm()


def test_auto_precision_is_bf16_only_where_the_device_computes_it_natively(monkeypatch, caplog):
    import kdcollapse.distributed as d

    cpu = torch.device("cpu")
    for native in (True, False):
        monkeypatch.setattr(d, "native_bf16", lambda device, native=native: native)
        assert resolve_precision("auto", cpu) is (torch.bfloat16 if native else None)
    monkeypatch.setattr(d, "_warned", set())
    with caplog.at_level("WARNING", logger="kdcollapse"):
        assert resolve_precision("bf16", cpu, option="train.amp") is torch.bfloat16  # honoured, with a warning
        resolve_precision("bf16", cpu, option="train.amp")
    (line,) = [r.getMessage() for r in caplog.records]  # once, on one line
    assert "train.amp=bf16: torch's CPU kernels here" in line and "no native bf16" in line and "slower than float32" in line
    assert "\n" not in line
    monkeypatch.setattr(d, "native_bf16", lambda device: True)
    caplog.clear()
    monkeypatch.setattr(d, "_warned", set())
    with caplog.at_level("WARNING", logger="kdcollapse"):
        resolve_precision("bf16", cpu, option="train.amp")
    assert not caplog.records
    assert d.cpu_capability().startswith(torch.backends.cpu.get_cpu_capability())


def test_auto_precision_is_recorded_as_what_it_resolved_to(tmp_path):
    from kdcollapse.distributed import native_bf16

    trainer = Trainer(tiny(tmp_path / "r", "train.amp=auto", "train.device=cpu", "model.name=mlp",
                           "model.kwargs={input_size: 8}"))
    assert trainer.amp_dtype is (torch.bfloat16 if native_bf16(torch.device("cpu")) else None)


def test_frozen_teacher_runs_in_inference_mode_and_returns_ordinary_float32_tensors():
    model = create_model("convnet_small", 10, in_channels=1).eval()
    teacher, x = FrozenTeacher(model), torch.randn(4, 1, 8, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        h, z = teacher(x)
    assert h.dtype == z.dtype == torch.float32 and not (h.is_inference() or z.is_inference())
    with torch.no_grad():
        assert torch.equal(teacher.logits(x), model(x))
    s = torch.randn(4, 10, requires_grad=True)  # a loss may save the teacher's probabilities for backward
    (z.softmax(1) * s.log_softmax(1)).sum().backward()
    assert s.grad is not None


@pytest.mark.parametrize("method", ["kd", "dhkd"])
def test_stored_teacher_logits_equal_the_online_teacher(tmp_path, teacher_run, method):
    common = ["model.name=mlp", "model.kwargs={input_size: 8}", f"method.name={method}",
              f"teacher.checkpoint={teacher_run}", "train.epochs=2"]
    online = fit(tiny(tmp_path / "online", *common)).run_dir
    offline = fit(tiny(tmp_path / "offline", *common, "teacher.cache=logits")).run_dir
    drop = ("images_per_s", "epoch_time_s")
    a, b = ([{k: v for k, v in r.items() if k not in drop} for r in read_metrics(d)] for d in (online, offline))
    assert a == b  # every logged loss part, accuracy and test metric, bit for bit
    assert (run_json(online)["teacher"], run_json(offline)["teacher"]) == ("online", "stored logits")


def test_stored_teacher_logits_are_refused_where_they_would_not_be_exact(tmp_path, teacher_run):
    base = [f"teacher.checkpoint={teacher_run}", "teacher.cache=logits", "model.name=convnet_small"]
    with raises_naming(ConfigError, "teacher.cache=logits", "data.crop_padding=1", "data.flip=false",
                       "teacher.cache=off"):
        Trainer(tiny(tmp_path / "a", *base, "method.name=kd", "data.crop_padding=1"))
    with pytest.raises(ConfigError, match="method 'rkd' also uses the teacher's features"):
        Trainer(tiny(tmp_path / "b", *base, "method.name=rkd"))


def test_stored_teacher_logits_need_a_selected_batch(teacher_run):
    from kdcollapse.methods import StoredLogits
    from kdcollapse.runs import load_model

    model, _ = load_model(teacher_run)
    cache = StoredLogits(FrozenTeacher(model), torch.arange(30.0).view(10, 3))
    with pytest.raises(KdcollapseError, match="was not selected"):
        cache.logits(torch.zeros(2, 1, 8, 8))
    cache.select(torch.tensor([4, 1]))
    assert cache.logits(torch.zeros(2, 1, 8, 8)).tolist() == [[12.0, 13.0, 14.0], [3.0, 4.0, 5.0]]
    with pytest.raises(KdcollapseError, match="logits only, not its features"):
        cache(torch.zeros(2, 1, 8, 8))


def test_analyze_defaults_skip_tsne_and_bf16_channels_last_agree_with_fp32(tmp_path, teacher_run):
    from kdcollapse.analysis import AnalyzeOptions, analyze, load_run

    def report(out, **options):
        subject = load_run(teacher_run, "test", device=torch.device("cpu"))
        return analyze(subject, tmp_path / out, AnalyzeOptions(progress=False, **options))

    fp32, fast = report("a"), report("b", precision="bf16", channels_last=True)
    assert "tsne" not in fp32["figures"] and not (tmp_path / "a" / "tsne.png").exists()
    assert fast["metrics"]["accuracy"] == pytest.approx(fp32["metrics"]["accuracy"], abs=0.02)
    for key in ("nc1", "vci", "ncc_accuracy"):
        assert fast["metrics"][key] == pytest.approx(fp32["metrics"][key], rel=0.05), key
    assert fast["metrics"]["nc1"] != fp32["metrics"]["nc1"]  # bf16 did run: the numbers moved a little
    with pytest.raises(ConfigError, match="--precision=fp16 needs a CUDA device"):
        report("c", precision="fp16")


def test_top_k_logits_keep_the_top_probabilities_and_the_rest_mass_at_the_temperature():
    from kdcollapse.methods import expand_logits, top_logits

    z = 3 * torch.randn(50, 100, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    for k, tau in ((1, 1.0), (5, 4.0), (20, 2.0)):
        top = top_logits(z.float(), k, tau)
        p, q = (z / tau).softmax(1), (expand_logits(**top, num_classes=100).double() / tau).softmax(1)
        idx = top["indices"].long()
        torch.testing.assert_close(q.gather(1, idx), p.gather(1, idx), rtol=1e-5, atol=1e-7)  # top-k exact
        rest = torch.ones_like(p, dtype=torch.bool).scatter(1, idx, False)
        torch.testing.assert_close((q * rest).sum(1), (p * rest).sum(1), rtol=1e-5, atol=1e-7)  # rest mass exact
        spread = q.masked_fill(~rest, float("nan"))
        assert torch.allclose(spread.nanmean(1, keepdim=True).expand_as(q)[rest], q[rest])  # spread evenly
        assert top["values"].dtype == torch.float32 and top["indices"].dtype == torch.int32


@pytest.mark.parametrize("method", ["kd", "dkd"])
def test_stored_top_k_logits_with_k_equal_to_k_classes_are_the_stored_logits(tmp_path, teacher_run, method):
    common = ["model.name=mlp", "model.kwargs={input_size: 8}", f"method.name={method}",
              f"teacher.checkpoint={teacher_run}", "teacher.cache=logits", "train.epochs=2"]
    full = fit(tiny(tmp_path / "full", *common)).run_dir
    top_all = fit(tiny(tmp_path / "top10", *common, "teacher.cache_topk=10")).run_dir
    top3 = fit(tiny(tmp_path / "top3", *common, "teacher.cache_topk=3")).run_dir
    drop = ("images_per_s", "epoch_time_s")
    a, b, c = ([{k: v for k, v in r.items() if k not in drop} for r in read_metrics(d)] for d in (full, top_all, top3))
    assert a == b  # k = K keeps every logit: the same run bit for bit
    assert a != c  # k = 3 changes the teacher's distribution outside its top 3 ...
    assert abs(a[0]["train_loss"] - c[0]["train_loss"]) < 0.02 * a[0]["train_loss"]  # ... a little
    assert run_json(top3)["teacher"] == "stored logits (top 3 of 10)"


def test_stored_top_k_logits_are_refused_where_they_are_not_enough(tmp_path, teacher_run):
    base = [f"teacher.checkpoint={teacher_run}", "model.name=convnet_small"]
    with pytest.raises(ConfigError, match="method 'dhkd' reads the teacher's logits otherwise"):
        Trainer(tiny(tmp_path / "a", *base, "method.name=dhkd", "teacher.cache=logits", "teacher.cache_topk=3"))
    with pytest.raises(ConfigError, match="teacher.cache=logits when teacher.cache_topk is set"):
        tiny(tmp_path / "b", *base, "method.name=kd", "teacher.cache_topk=3")


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # torch.compile's own use of torch.jit internals
def test_a_compiled_student_is_evaluated_eagerly_without_compiling(tmp_path, caplog):
    """train.compile compiles the training graph only: evaluation runs the same student eagerly
    (torch.compiler.set_stance("force_eager")), so no eval-mode graph is ever compiled."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    common = ["model.name=mlp", "model.kwargs={input_size: 8}", "train.epochs=1"]
    compiled = Trainer(tiny(tmp_path / "compiled", *common, "train.compile=true"))
    assert "train.compile on the CPU" in caplog.text  # measured no faster here: the user is told
    caplog.clear()
    eager = Trainer(tiny(tmp_path / "eager", *common))
    assert "train.compile" not in caplog.text
    assert compiled.evaluate() == eager.evaluate()  # same initial weights, same numbers
    assert sum(counters["frames"].values()) == 0, dict(counters["frames"])  # nothing was compiled
