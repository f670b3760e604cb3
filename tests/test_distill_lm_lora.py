"""`kdcollapse distill-lm` with a LoRA student (``student.lora``, through peft): only the adapter is trained and
checkpointed, a resume (also after kill -9) continues bit for bit, and ``student/`` is the adapter merged into
the base weights: a plain Hugging Face directory whose logits equal the adapted model's."""

import json

import pytest
import torch

from kdcollapse import lm
from kdcollapse.cli import main
from kdcollapse.runs import load_tensors, read_committed_metrics
from kdcollapse.train import distill_lm, load_lm_config

pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
pytest.importorskip("peft", reason="pip install 'kdcollapse[peft]'")
from tiny_lm import distill_lm_files  # noqa: E402

LORA = {"r": 4, "alpha": 8, "dropout": 0.1, "target_modules": ["q_proj", "v_proj", "down_proj"]}


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lora")
    student, files = distill_lm_files(root, student_layers=2)
    return root, student, [*files[:-1],  # its student= is the one of options(), with the adapter
                           "block_size=8", "train_blocks=40", "eval_blocks=4", "batch_size=4", "steps=4",
                           "eval_every=2", "warmup=1", "teacher_k=16", "chunk_size=10", "lr=0.05",
                           "loss.ce_weight=0.5", "progress=false"]


def options(setup, lora=LORA, **student_extra):
    root, student, common = setup
    return [*common, f"student={json.dumps({**student, **student_extra, 'lora': lora})}"]


def adapted(root, run, student, lora=LORA):
    """The run's adapter on the base student rebuilt by hand with peft (not through kdcollapse's wrapper)."""
    import peft

    tokenizer = lm.load_tokenizer(root / "teacher")
    base = lm.load_language_model({"vocab_size": len(tokenizer), **student}, tokenizer=tokenizer, seed=0).model
    model = peft.get_peft_model(base, peft.LoraConfig(r=lora["r"], lora_alpha=lora["alpha"],
                                                      target_modules=lora["target_modules"]))
    tensors, meta = load_tensors(run / "checkpoint.safetensors")
    trained = {k.removeprefix("student."): v for k, v in tensors.items() if k.startswith("student.")}
    missing = model.get_base_model().load_state_dict(trained, strict=False)
    assert not missing.unexpected_keys
    return model.eval(), trained, meta


def test_only_the_adapter_is_trained_and_saved_and_the_export_is_merged(setup):
    root, student, _ = setup
    run = root / "run"
    record = distill_lm(load_lm_config(None, [*options(setup), f"run_dir={run}"]), log=lambda *_: None)
    assert record["step"] == 4
    model, trained, meta = adapted(root, run, student)
    # the checkpoint's student tensors are the adapter's A and B of each targeted layer, nothing else
    assert trained and all(".lora_A." in k or ".lora_B." in k for k in trained), sorted(trained)
    assert {k.split(".")[-4] for k in trained} == set(LORA["target_modules"])
    assert len(trained) == 2 * 3 * student["num_hidden_layers"] and len(meta["student_base"]) == 64
    assert all(v.abs().max() > 0 for k, v in trained.items() if ".lora_B." in k)  # B starts at 0: it trained
    info = json.loads((run / "run.json").read_text())
    assert info["trained_parameters"] == sum(v.numel() for v in trained.values()) < info["student_parameters"]
    # student/ is a plain HF directory (no adapter files) whose logits equal the adapted model's
    assert not (run / "student" / "adapter_config.json").exists()
    merged = lm.load_language_model(run / "student").model.eval()
    assert not any("lora" in k for k in merged.state_dict())
    ids = torch.randint(len(lm.load_tokenizer(root / "teacher")), (3, 8), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        want, got = model(ids).logits, merged(ids).logits
        base = model.get_base_model()
        with model.disable_adapter():
            plain = base(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert (plain - want).abs().max() > 1e-3  # the adapter changes the logits: a merge left out would fail
    # the frozen weights are untouched: the merged weight minus the base is exactly scale * B @ A
    name = "model.layers.0.self_attn.q_proj"
    a, b = trained[f"{name}.lora_A.default.weight"], trained[f"{name}.lora_B.default.weight"]
    w = base.get_submodule(name).base_layer.weight
    torch.testing.assert_close(merged.get_submodule(name).weight, w + LORA["alpha"] / LORA["r"] * b @ a,
                               rtol=1e-6, atol=1e-6)


def records(run):
    return [{k: v for k, v in json.loads(x).items() if k != "step_seconds"}
            for x in (run / "metrics.jsonl").read_text().splitlines()]


def same_students(a, b):
    other = lm.load_language_model(b / "student").model.state_dict()
    for name, value in lm.load_language_model(a / "student").model.state_dict().items():
        assert torch.equal(other[name], value), name


def test_a_lora_run_resumes_bit_for_bit_with_dropout_and_a_saved_head(setup):
    root, _, _ = setup
    lora = {**LORA, "modules_to_save": ["lm_head"]}
    opts = [*options(setup, lora), "student.tie_word_embeddings=false"]
    distill_lm(load_lm_config(None, [*opts, f"run_dir={root / 'whole'}"]), log=lambda *_: None)
    distill_lm(load_lm_config(None, [*opts, f"run_dir={root / 'part'}", "steps=2"]), log=lambda *_: None)
    tensors, _ = load_tensors(root / "part" / "checkpoint.safetensors")
    assert any("modules_to_save" in k for k in tensors), sorted(tensors)
    distill_lm(load_lm_config(root / "part" / "config.yaml", ["steps=4"]), resume=True, log=lambda *_: None)
    assert records(root / "part") == records(root / "whole")
    same_students(root / "part", root / "whole")


def test_an_adapter_is_refused_on_other_base_weights_or_another_rank(setup):
    """A resume rebuilds the frozen base from the config; if that is not the base the adapter was trained on
    (another seed; a teacher file changed under a teacher-initialised student) the checkpoint is refused."""
    from kdcollapse.errors import CheckpointError
    from kdcollapse.lm._lora import LoraStudent, lora_section

    _, student, _ = setup

    def wrapped(seed, lora=LORA):
        model = lm.load_language_model({"vocab_size": 300, **student}, seed=seed).model
        return LoraStudent(model, lora_section(lora))

    a, b = wrapped(0), wrapped(1)
    meta = {"student_base": a.base_digest}
    wrapped(0).load_state_dict(a.state_dict(), meta, "ckpt")  # the same base: accepted
    with pytest.raises(CheckpointError, match="trained on other base weights"):
        b.load_state_dict(a.state_dict(), meta, "ckpt")
    with pytest.raises(CheckpointError, match="was student.lora.r changed"):
        wrapped(0, {**LORA, "r": 2}).load_state_dict(a.state_dict(), meta, "ckpt")


@pytest.mark.parametrize("lora, message", [
    ({"r": 0}, "student.lora.r must be a positive int, got 0"),
    ({"rank": 4}, "unknown key student.lora.rank; valid keys: r, alpha, dropout, target_modules, modules_to_save"),
    ({"dropout": 1.0}, "student.lora.dropout must be a number in [0, 1)"),
    ({"target_modules": []}, "student.lora.target_modules must be all-linear or a non-empty list"),
    ({"target_modules": ["qkv"]}, "this student has no module 'qkv'; its linear layers are down_proj, gate_proj, "
                                  "k_proj, lm_head, o_proj, q_proj, up_proj, v_proj"),
])
def test_bad_lora_options_are_one_line_errors_before_the_run_dir_is_written(setup, capsys, lora, message):
    root, _, _ = setup
    run = root / "bad"
    assert main(["distill-lm", *options(setup, lora), f"run_dir={run}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert not (run / "config.yaml").exists()


def test_without_peft_a_lora_student_is_one_line_naming_the_extra(setup, capsys, monkeypatch):
    import sys

    root, _, _ = setup
    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    assert main(["distill-lm", *options(setup), f"run_dir={root / 'nopeft'}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "pip install 'kdcollapse[peft]'" in err[0], err


@pytest.mark.slow
def test_kill_9_during_a_lora_run_then_resume_bit_for_bit(setup, tmp_path):
    import signal
    import time

    from ranks import Forked

    common = [*options(setup), "steps=30", "eval_every=1"]
    run = tmp_path / "killed"
    proc = Forked(["distill-lm", *common, f"run_dir={run}"], tmp_path / "first.err")
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").exists():  # renamed in after the commit's checkpoint: both are there
            assert proc.poll() is None and time.time() < deadline, proc.stderr()[-2000:]
            time.sleep(0.01)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr()[-2000:]
    # the kill may land between the commit and the renames that complete it (metrics.jsonl still staged):
    # the committed records are read through state.json, as a resume reads them
    assert len(read_committed_metrics(run)) < 30
    assert main(["distill-lm", "--resume", str(run)]) == 0
    distill_lm(load_lm_config(None, [*common, f"run_dir={tmp_path / 'straight'}"]), log=lambda *_: None)
    assert records(run) == records(tmp_path / "straight") and len(records(run)) == 30
    same_students(run, tmp_path / "straight")


def test_the_documented_overrides_make_these_lora_sections():
    """docs/language_models.md, "LoRA students": the two commands' overrides."""
    from pathlib import Path

    from kdcollapse.lm._lora import split_student

    text = (Path(__file__).parents[1] / "docs" / "language_models.md").read_text()
    first = "'student.lora={r: 8, alpha: 16, dropout: 0.05, target_modules: [q_proj, v_proj]}'"
    second = "'student.lora={r: 4, modules_to_save: [lm_head]}' \\\n    student.tie_word_embeddings=false"
    assert first in text and second in text
    lora = split_student(load_lm_config(None, [first.strip("'")]).student)[1]
    assert (lora.r, lora.alpha, lora.dropout, lora.target_modules) == (8, 16, 0.05, ["q_proj", "v_proj"])
    cfg = load_lm_config(None, ["student.lora={r: 4, modules_to_save: [lm_head]}", "student.tie_word_embeddings=false"])
    lora = split_student(cfg.student)[1]
    assert (lora.r, lora.modules_to_save, lora.target_modules, cfg.student["tie_word_embeddings"]) == (
        4, ["lm_head"], "all-linear", False)


def test_a_lora_adapter_on_a_teacher_initialised_student(setup):
    """The common case: the teacher's layer 0 (and its embeddings and head) frozen, a LoRA adapter trained."""
    root, _, common = setup
    run = root / "from-teacher"
    student = {"init": {"from": "teacher", "layers": [0]}, "lora": {"r": 2, "target_modules": ["q_proj", "v_proj"]}}
    distill_lm(load_lm_config(None, [*common, f"student={json.dumps(student)}", f"run_dir={run}", "steps=2"]),
               log=lambda *_: None)
    tensors, meta = load_tensors(run / "checkpoint.safetensors")
    trained = [k for k in tensors if k.startswith("student.")]
    assert len(trained) == 4 and all(".lora_" in k for k in trained), trained
    teacher = lm.load_language_model(root / "teacher").model.state_dict()
    merged = lm.load_language_model(run / "student").model.state_dict()
    assert torch.equal(merged["model.layers.0.mlp.up_proj.weight"], teacher["model.layers.0.mlp.up_proj.weight"])
    assert not torch.equal(merged["model.layers.0.self_attn.q_proj.weight"],
                           teacher["model.layers.0.self_attn.q_proj.weight"])
