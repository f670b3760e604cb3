"""`kdcollapse distill-lm` end to end on a tiny random teacher, tokenizer and corpus: stored and online
teacher, CE only, the run directory, exact resume, the CLI and its one-line errors."""

import json

import pytest
import torch

from kdcollapse import lm
from kdcollapse.cli import main
from kdcollapse.train import distill_lm, load_lm_config

pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
from tiny_lm import llama_config, tiny_tokenizer, write_corpus  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    tokenizer = tiny_tokenizer()
    teacher = lm.load_language_model(llama_config(len(tokenizer), hidden=48), tokenizer=tokenizer, seed=0)
    teacher.model.save_pretrained(root / "teacher")
    tokenizer.save_pretrained(root / "teacher")
    write_corpus(root / "corpus", copies=12)
    student = {k: v for k, v in llama_config(len(tokenizer), hidden=16, layers=1).items() if k != "vocab_size"}
    return root, [f"teacher={root / 'teacher'}", f"corpus={root / 'corpus'}", f"cache_dir={root / 'cache'}",
                  f"student={json.dumps(student)}", "block_size=8", "train_blocks=40", "eval_blocks=4",
                  "batch_size=4", "steps=4", "eval_every=2", "warmup=1", "teacher_k=16", "chunk_size=10"]


def test_a_run_writes_its_directory_and_resumes_bit_for_bit(setup):
    root, options = setup
    whole = load_lm_config(None, [*options, f"run_dir={root / 'whole'}", "loss.ce_weight=0.5"])
    record = distill_lm(whole, log=lambda *_: None)
    assert record["step"] == 4 and record["test_perplexity"] > 1 and 0 <= record["test_agreement"] <= 1
    lines = [json.loads(x) for x in (root / "whole" / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [2, 4]
    assert {"config.yaml", "run.json", "checkpoint.safetensors", "student"} <= {p.name for p in (root / "whole").iterdir()}
    reloaded = lm.load_language_model(root / "whole" / "student")
    part = load_lm_config(None, [*options, f"run_dir={root / 'part'}", "loss.ce_weight=0.5", "steps=2"])
    distill_lm(part, log=lambda *_: None)
    resumed = load_lm_config(root / "part" / "config.yaml", ["steps=4"])
    assert distill_lm(resumed, resume=True, log=lambda *_: None) == record | {"step_seconds": pytest.approx(0, abs=1e9)}
    a = lm.load_language_model(root / "part" / "student").model.state_dict()
    for name, value in reloaded.model.state_dict().items():
        assert torch.equal(a[name], value), name


@pytest.mark.parametrize("overrides", [["teacher_k=null", "loss.divergence=jsd", "loss.weight=0.5"],
                                       ["precision=bf16", "loss.divergence=reverse_kl", "accumulate=2"]])
def test_online_teacher_and_bf16_paths_train(setup, overrides):  # CE only: the CLI test's --baseline
    root, options = setup
    name = "-".join(o.split("=")[1] for o in overrides[:1])
    cfg = load_lm_config(None, [*options, f"run_dir={root / name}", "steps=2", *overrides])
    record = distill_lm(cfg, log=lambda *_: None)
    assert record["step"] == 2 and all(map(torch.isfinite, map(torch.tensor, [record["validation_perplexity"],
                                                                             record["train_loss"]])))


def test_the_cli_prints_both_students_and_bad_input_is_one_line(setup, capsys):
    root, options = setup
    assert main(["distill-lm", *options, f"run_dir={root / 'cli'}", "steps=2", "--baseline"]) == 0
    out = capsys.readouterr().out
    assert "distilled: test perplexity" in out and "ce_only: test perplexity" in out
    for bad, message in ((["loss.divergence=kl"], "loss.divergence must be one of none, forward_kl"),
                         (["stepz=3"], "unknown key 'stepz'"),
                         ([f"teacher={root / 'nothing'}"], "not found"),
                         ([f"run_dir={root / 'cli'}"], "already holds a run")):
        assert main(["distill-lm", *options, f"run_dir={root / 'fresh'}", *bad]) == 2
        assert message in capsys.readouterr().err
    assert not (root / "fresh").exists()  # refused before anything on disk changed
