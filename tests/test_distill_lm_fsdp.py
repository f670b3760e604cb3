"""`kdcollapse distill-lm` with FSDP2 (``distributed.strategy=fsdp``) on two gloo processes: the same student as
one process on the same global batch (float tolerance), the run directory's checkpoint in the one-process
format, and a resume that continues bit for bit."""

import json

import pytest
import torch

from kdcollapse import lm
from kdcollapse.cli import main
from kdcollapse.train import distill_lm, load_lm_config

pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
from ranks import run_on_ranks, run_ranks  # noqa: E402
from tiny_lm import distill_lm_files, llama_config  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    _, files = distill_lm_files(root, student_layers=3)
    return root, [*files, "block_size=8", "train_blocks=40", "eval_blocks=4", "steps=4", "eval_every=2", "warmup=1", "teacher_k=16", "chunk_size=10", "lr=0.01",
                  "loss.ce_weight=0.5", "progress=false"]


def records(run):
    return [{k: v for k, v in json.loads(x).items() if k != "step_seconds"}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def student(run):
    return lm.load_language_model(run / "student").model.state_dict()


@pytest.mark.slow  # three runs of two forked gloo processes: about 30 s of CPU
def test_two_fsdp_processes_train_one_processs_student_and_resume_bit_for_bit(setup):
    root, options = setup
    fsdp = [*options, "distributed.strategy=fsdp", "batch_size=2", "accumulate=2"]
    distill_lm(load_lm_config(None, [*options, "batch_size=8", f"run_dir={root / 'one'}"]), log=lambda *_: None)
    done = run_ranks(["distill-lm", *fsdp, f"run_dir={root / 'fsdp'}"])
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads((root / "fsdp" / "run.json").read_text())["distributed"]
    total = json.loads((root / "one" / "run.json").read_text())["student_parameters"]
    assert info["strategy"] == "fsdp" and info["world_size"] == 2 and info["sharded_layers"] == 3
    assert info["parameters_per_process"] < total  # the layers' parameters are split, not copied
    # the same student and metrics as one process on the same 8 blocks per step, within float32 rounding
    one, sharded = student(root / "one"), student(root / "fsdp")
    for key, value in one.items():
        torch.testing.assert_close(sharded[key], value, rtol=1e-4, atol=1e-5, msg=key)  # measured: <= 1.5e-6
    for a, b in zip(records(root / "fsdp"), records(root / "one"), strict=True):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-5) for k in a), (a, b)
    # a resume under FSDP continues bit for bit; its checkpoint is the one-process format
    assert run_ranks(["distill-lm", *fsdp, "steps=2", f"run_dir={root / 'part'}"]).returncode == 0
    done = run_ranks(["distill-lm", "--resume", str(root / "part"), "steps=4"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert records(root / "part") == records(root / "fsdp")
    resumed = student(root / "part")
    for key, value in sharded.items():
        assert torch.equal(resumed[key], value), key
    # another strategy on resume is refused (it is part of the run's config); one process resumes the FSDP
    # run (the checkpoint holds whole tensors: the one-process format)
    assert main(["distill-lm", "--resume", str(root / "part"), "steps=6", "distributed.strategy=ddp"]) == 2
    assert main(["distill-lm", "--resume", str(root / "part"), "steps=6"]) == 0
    assert [r["step"] for r in records(root / "part")] == [2, 4, 6]


def fsdp_student():
    """A 3-layer Llama student (tied embeddings), the same weights in every process."""
    return lm.load_language_model(llama_config(64, hidden=16, layers=3), seed=0).model


GLOBAL_BATCH = torch.randint(64, (4, 8), generator=torch.Generator().manual_seed(1))  # 2 blocks a process


def shard_gradients(path):
    """What one rank runs: the FSDP student's backward on its own half of GLOBAL_BATCH, the gradients reduced
    as a distill-lm step reduces them, and the whole gradients (gathered) saved by rank 0 to ``path``."""
    def run() -> int:
        import torch.distributed as dist
        from torch.distributed.tensor import DTensor

        from kdcollapse.train._fsdp import Sharded

        dist.init_process_group("gloo")
        rank, world_size = dist.get_rank(), dist.get_world_size()
        model = fsdp_student()
        sharded = Sharded(model, world_size, rank == 0)
        mine = GLOBAL_BATCH.view(world_size, -1, GLOBAL_BATCH.shape[1])[rank]
        model(mine, labels=mine).loss.backward()
        sharded.average_replicated_gradients()
        grads = {name: p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad
                 for name, p in model.named_parameters()}
        if rank == 0:
            torch.save(grads, path)
        dist.destroy_process_group()
        return 0
    return run


def test_two_fsdp_processes_average_the_gradients_of_their_different_halves(tmp_path):
    """Each rank backpropagates its own half of a batch; the sharded layers' (reduce-scattered) and the replicated
    embeddings' (all-reduced) gradients are the one-process gradient of the whole batch: averaged, not summed,
    and not a rank's own. Checked on the gradients themselves: the training test above sees a factor 2 only
    through AdamW's eps and the clipping, as Adam's step is nearly invariant to the gradient's scale."""
    import kdcollapse.train._fsdp  # noqa: F401 - imported once here, not in each forked rank (seconds each)

    whole, half = fsdp_student(), fsdp_student()
    whole(GLOBAL_BATCH, labels=GLOBAL_BATCH).loss.backward()  # the mean over the tokens of both halves
    half(GLOBAL_BATCH[:2], labels=GLOBAL_BATCH[:2]).loss.backward()  # rank 0's data alone
    done = run_on_ranks(shard_gradients(tmp_path / "grads.pt"), timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    reduced = torch.load(tmp_path / "grads.pt")
    assert {name for name, _ in whole.named_parameters()} == set(reduced)
    assert any(name.startswith("model.layers.") for name in reduced) and "model.embed_tokens.weight" in reduced
    for (name, p), (_, q) in zip(whole.named_parameters(), half.named_parameters()):
        torch.testing.assert_close(reduced[name], p.grad, rtol=1e-5, atol=1e-7, msg=name)
        assert (p.grad - q.grad).abs().max() > 1e-3 * p.grad.abs().max(), name  # the halves' gradients differ


@pytest.mark.slow  # four runs of two forked gloo processes
def test_a_lora_student_under_fsdp_matches_one_process_and_resumes_bit_for_bit(setup):
    """student.lora with distributed.strategy=fsdp: the decoder layers (frozen base and adapter) sharded; the
    merged student and the metrics equal one process's LoRA run on the same global batch (float tolerance); the
    checkpoint holds the adapter only, as one process's; a resume continues bit for bit."""
    from kdcollapse.runs import load_tensors

    root, options = setup
    lora = [*options, "student.lora={r: 2, alpha: 4}"]
    fsdp = [*lora, "distributed.strategy=fsdp", "batch_size=2", "accumulate=2"]
    distill_lm(load_lm_config(None, [*lora, "batch_size=8", f"run_dir={root / 'lora-one'}"]), log=lambda *_: None)
    done = run_ranks(["distill-lm", *fsdp, f"run_dir={root / 'lora-fsdp'}"])
    assert done.returncode == 0, done.stderr[-3000:]
    info = json.loads((root / "lora-fsdp" / "run.json").read_text())
    assert info["distributed"]["sharded_layers"] == 3 and info["trained_parameters"] < info["student_parameters"]
    assert info["distributed"]["parameters_per_process"] < info["student_parameters"]
    one, sharded = student(root / "lora-one"), student(root / "lora-fsdp")
    assert one.keys() == sharded.keys() and not any("lora" in k for k in one)  # merged on export
    for key, value in one.items():
        torch.testing.assert_close(sharded[key], value, rtol=1e-4, atol=1e-5, msg=key)
    for a, b in zip(records(root / "lora-fsdp"), records(root / "lora-one"), strict=True):
        assert a.keys() == b.keys() and all(a[k] == pytest.approx(b[k], rel=1e-5) for k in a), (a, b)
    saved = {k for k in load_tensors(root / "lora-fsdp" / "checkpoint.safetensors")[0] if k.startswith("student.")}
    assert saved == {k for k in load_tensors(root / "lora-one" / "checkpoint.safetensors")[0]
                     if k.startswith("student.")} and all("lora_" in k for k in saved)
    assert run_ranks(["distill-lm", *fsdp, "steps=2", f"run_dir={root / 'lora-part'}"]).returncode == 0
    done = run_ranks(["distill-lm", "--resume", str(root / "lora-part"), "steps=4"])
    assert done.returncode == 0, done.stderr[-3000:]
    assert records(root / "lora-part") == records(root / "lora-fsdp")
    resumed = student(root / "lora-part")
    for key, value in sharded.items():
        assert torch.equal(resumed[key], value), key


@pytest.mark.parametrize("bad, message", [
    (["distributed.strategy=zero3"], "distributed.strategy"),
    (["distributed.strategy=fsdp", "generation.lmbda=0.5"], "distributed.strategy=fsdp does not take generation"),
])
def test_bad_distributed_options_are_one_line_errors(setup, capsys, bad, message):
    root, options = setup
    assert main(["distill-lm", *options, *bad, "batch_size=2", f"run_dir={root / 'bad'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (root / "bad").exists()


def test_the_documented_torchrun_command_takes_the_fsdp_strategy():
    """docs/language_models.md, "FSDP2": its command's options make an FSDP config (the run itself is the
    two-process test above)."""
    from pathlib import Path

    text = (Path(__file__).parents[1] / "docs" / "language_models.md").read_text()
    command = ("torchrun --standalone --nproc_per_node=2 -m kdcollapse distill-lm --config lm/smollm2_tiny "
               "distributed.strategy=fsdp")
    assert command in text
    from kdcollapse.recipes import recipe_path

    cfg = load_lm_config(recipe_path("lm/smollm2_tiny"), ["distributed.strategy=fsdp"])
    assert cfg.distributed.strategy == "fsdp"
