"""`kdcollapse distill-lm` end to end on a tiny random teacher, tokenizer and corpus: stored and online
teacher, CE only, the run directory, exact resume, the CLI and its one-line errors."""

import json
from pathlib import Path

import pytest
import torch

from kdcollapse import lm
from kdcollapse.cli import main
from kdcollapse.train import distill_lm, load_lm_config

pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
from tiny_lm import distill_lm_files, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    _, files = distill_lm_files(root)
    return root, [*files, "block_size=8", "train_blocks=40", "eval_blocks=4", "batch_size=4", "steps=4",
                  "eval_every=2", "warmup=1", "teacher_k=16", "chunk_size=10"]


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
    again = distill_lm(load_lm_config(root / "part" / "config.yaml", []), resume=True, log=lambda *_: None)
    assert again == json.loads((root / "part" / "metrics.jsonl").read_text().splitlines()[-1])  # finished: nothing to train
    assert again["step"] == 4 and again["test_perplexity"] == record["test_perplexity"]
    a = lm.load_language_model(root / "part" / "student").model.state_dict()
    for name, value in reloaded.model.state_dict().items():
        assert torch.equal(a[name], value), name


@pytest.mark.parametrize("overrides", [["teacher_k=null", "loss.divergence=jsd", "loss.beta=0.5"],
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


# --- sampled blocks: GKD's on-policy fraction (lmbda) and seq_kd -----------------------------------------

def test_sampling_is_greedy_generate_at_temperature_0_and_repeats_under_a_seed(setup):
    root, _ = setup
    model = lm.load_language_model(root / "teacher").model
    prompts = torch.randint(0, 300, (3, 5), generator=torch.Generator().manual_seed(0))
    greedy = lm.sample_completions(model, prompts, 6, temperature=0)
    reference = model.generate(prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=6, do_sample=False,
                               eos_token_id=None, pad_token_id=0)
    assert torch.equal(greedy.sequences, reference) and greedy.completion_mask.all()
    a, b, c = (lm.sample_completions(model, prompts, 6, temperature=0.9, generator=torch.Generator().manual_seed(s))
               for s in (1, 1, 2))
    assert torch.equal(a.sequences, b.sequences) and not torch.equal(a.sequences, c.sequences)
    # a row's first end-of-text is kept and counted, everything after it is end-of-text and not counted
    eos = int(greedy.sequences[0, 7])
    cut = lm.sample_completions(model, prompts, 6, temperature=0, eos_token_id=eos)
    first = int((cut.sequences[0, 5:] == eos).nonzero()[0])
    assert cut.completion_mask[0].tolist() == [i <= first for i in range(6)]
    assert (cut.sequences[0, 5 + first:] == eos).all()
    assert torch.equal(cut.sequences[0, :5 + first], greedy.sequences[0, :5 + first])


def test_on_policy_loss_is_the_divergence_on_the_students_completions_only(setup):
    """lmbda = 1: every block is the student's completion of its first half, scored by the teacher with
    JSD(0.5) at the completion's positions only: equal to the plain (unfused) computation."""
    from kdcollapse.losses.llm import token_divergence
    from kdcollapse.train._lm_task import _loss, _Teacher

    root, options = setup
    cfg = load_lm_config(None, [*options, "run_dir=unused", "loss.divergence=jsd", "loss.beta=0.5",
                                "generation.lmbda=1", "teacher_k=null", "generation.temperature=1.5"])
    teacher = _Teacher(str(root / "teacher"))
    student = lm.load_language_model(root / "teacher").model  # any model: the teacher scores it
    student.model.layers[0].mlp.down_proj.weight.data.mul_(0.5)  # so student and teacher differ
    train = torch.randint(0, 300, (6, 8), generator=torch.Generator().manual_seed(0))
    micro = torch.tensor([1, 4, 2, 0])
    got = _loss(cfg, student, teacher, train, None, micro, torch.Generator().manual_seed(7), eos=None)
    sampled = lm.sample_completions(student, train[micro, :4], 4, temperature=1.5,
                                    generator=torch.Generator().manual_seed(7)).sequences
    with torch.no_grad():
        q, p = student(sampled).logits[:, 3:-1], teacher.model(sampled).logits[:, 3:-1]
        want = token_divergence(q.reshape(-1, 300), p.reshape(-1, 300).log_softmax(-1), "jsd", beta=0.5,
                                reduction="none").mean()
    torch.testing.assert_close(got.detach(), want.to(got.dtype), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("overrides", [["loss.divergence=jsd", "loss.beta=0.5", "generation.lmbda=0.5"],
                                       ["loss.divergence=none", "loss.ce_weight=1", "generation.seq_kd=true"],
                                       ["loss.divergence=distillm2", "generation.seq_kd=true", "generation.lmbda=0.5",
                                        "teacher_k=null", "loss.alpha=0.2"]],
                         ids=["on_policy", "seq_kd", "distillm2"])
def test_sampled_runs_resume_bit_for_bit(setup, overrides):
    root, options = setup
    name = overrides[-1].split(".")[1].split("=")[0]
    whole = distill_lm(load_lm_config(None, [*options, f"run_dir={root / name}", *overrides]), log=lambda *_: None)
    distill_lm(load_lm_config(None, [*options, f"run_dir={root / (name + '-part')}", *overrides, "steps=2"]),
               log=lambda *_: None)
    resumed = load_lm_config(root / (name + "-part") / "config.yaml", ["steps=4"])
    assert distill_lm(resumed, resume=True, log=lambda *_: None) == whole | {"step_seconds": pytest.approx(0, abs=1e9)}
    a = lm.load_language_model(root / (name + "-part") / "student").model.state_dict()
    for key, value in lm.load_language_model(root / name / "student").model.state_dict().items():
        assert torch.equal(a[key], value), key


@pytest.mark.parametrize("bad, message", [
    (["generation.lmbda=0.3"], "lmbda x batch_size must be a whole number of blocks, got 0.3 x 4"),
    (["generation.lmbda=0.5", "loss.divergence=none", "loss.ce_weight=1"], "choose a loss.divergence"),
    (["generation.seq_kd=true", "generation.prompt_tokens=6", "generation.max_new_tokens=4"], "sum <= block_size (8)"),
    (["generation.lmbda=2"], "must be in [0, 1]")])
def test_bad_generation_options_are_one_line_errors(setup, capsys, bad, message):
    root, options = setup
    assert main(["distill-lm", *options, f"run_dir={root / 'bad'}", *bad]) == 2
    assert message in capsys.readouterr().err and not (root / "bad").exists()


def test_a_run_directory_in_use_is_refused(setup, capsys):
    from kdcollapse.runs import RunLock

    root, options = setup
    (root / "busy").mkdir()
    lock = RunLock(root / "busy")
    try:
        assert main(["distill-lm", *options, f"run_dir={root / 'busy'}"]) == 2
        assert "is in use by another process" in capsys.readouterr().err
    finally:
        lock.release()
    assert [p.name for p in (root / "busy").iterdir()] == [".lock"]  # nothing written


def test_a_resume_refuses_a_hand_edited_config_and_writes_its_overrides_into_it(setup, capsys):
    """Issue 28 for distill-lm: config.yaml is the config the run executes, its SHA-256 in run.json; a hand edit
    is refused on resume with one line and nothing written; a resume's overrides go into config.yaml (run.json
    keeps the old digest too); a last metrics line a crash tore is dropped on resume."""
    import hashlib
    import re

    def digest(path):
        return hashlib.sha256(path.read_bytes()).hexdigest()

    root, options = setup
    run = root / "edited"
    distill_lm(load_lm_config(None, [*options, f"run_dir={run}", "steps=2"]), log=lambda *_: None)
    config, facts = run / "config.yaml", run / "run.json"
    original, first = config.read_bytes(), digest(config)
    assert json.loads(facts.read_text())["config_sha256"] == first
    with open(run / "metrics.jsonl", "a") as f:  # step 4's line, torn by a crash before its checkpoint
        f.write('{"step": 4, "train_lo')

    text = config.read_text()
    assert re.search(r"^lr: ", text, flags=re.M)
    config.write_text(re.sub(r"^lr: .*$", "lr: 5.0", text, flags=re.M))
    files = {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()}
    capsys.readouterr()  # the first run's progress bars
    assert main(["distill-lm", "--resume", str(run), "steps=4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "was edited after the run wrote it" in err[0] and "steps=N" in err[0]
    assert {p.name: p.read_bytes() for p in run.iterdir() if p.is_file()} == files  # locks included

    config.write_bytes(original)
    assert main(["distill-lm", "--resume", str(run), "steps=4"]) == 0
    assert load_lm_config(config, []).steps == 4
    recorded = json.loads(facts.read_text())
    assert recorded["config_sha256"] == digest(config) != first and recorded["config_sha256_previous"] == first
    assert [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()] == [2, 4]


def test_accumulated_micro_batches_match_one_batch(setup, tmp_path):
    """1 process x 4 blocks x 2 accumulated micro-batches trains the same student as 1 process x 8 blocks
    (the step's 8 blocks are the same draws; each micro-batch's mean loss is divided by 2)."""
    root, options = setup
    for name, extra in {"one": ["batch_size=8"], "accumulated": ["batch_size=4", "accumulate=2"]}.items():
        distill_lm(load_lm_config(None, [*options, "steps=2", "loss.ce_weight=0.5", *extra,
                                         f"run_dir={tmp_path / name}"]), log=lambda *_: None)
    one = lm.load_language_model(tmp_path / "one" / "student").model.state_dict()
    other = lm.load_language_model(tmp_path / "accumulated" / "student").model.state_dict()
    for key, value in one.items():
        torch.testing.assert_close(other[key], value, rtol=1e-5, atol=1e-6, msg=key)


@pytest.mark.heavy  # two torchrun processes each importing torch and transformers: about a minute here
def test_torchrun_two_processes_match_one_batch(setup, tmp_path):
    """2 gloo processes x 2 blocks x 2 accumulated micro-batches train the same student as 1 process x 8
    blocks; only the main process reports.  pytest -m heavy tests/test_distill_lm.py"""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root, options = setup
    common = [*options, "steps=2", "loss.ce_weight=0.5"]
    distill_lm(load_lm_config(None, [*common, "batch_size=8", f"run_dir={tmp_path / 'one'}"]), log=lambda *_: None)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "kdcollapse",
           "distill-lm", *common, "batch_size=2", "accumulate=2", f"run_dir={tmp_path / 'ddp'}"]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("distilled: test perplexity") == 1
    one = lm.load_language_model(tmp_path / "one" / "student").model.state_dict()
    ddp = lm.load_language_model(tmp_path / "ddp" / "student").model.state_dict()
    for key, value in one.items():
        torch.testing.assert_close(ddp[key], value, rtol=1e-5, atol=1e-6, msg=key)


def test_the_study_step_starts_again_a_run_stopped_before_its_first_commit(setup, tmp_path, monkeypatch):
    """A distill_lm run killed after writing config.yaml and run.json but before its first commit has nothing to
    resume: the study step starts it again (it stopped a study launch before), and the run equals an
    uninterrupted one."""
    import dataclasses

    import yaml

    from kdcollapse.runs import run_state
    from kdcollapse.study import _steps
    from kdcollapse.train import _lm_task

    root, options = setup
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(dataclasses.asdict(load_lm_config(None, [*options, "steps=2"]))))
    whole = _steps.distill_lm(0, tmp_path / "whole", str(config))
    with monkeypatch.context() as patch:
        patch.setattr(_lm_task.LMTask, "loss", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt("killed")))
        with pytest.raises(KeyboardInterrupt):
            _steps.distill_lm(0, tmp_path / "stopped", str(config))
    assert (tmp_path / "stopped" / "config.yaml").is_file() and run_state(tmp_path / "stopped") == "new"
    again = _steps.distill_lm(0, tmp_path / "stopped", str(config))
    assert {k: v for k, v in again.items() if not k.startswith("cpu_seconds")} == \
        {k: v for k, v in whole.items() if not k.startswith("cpu_seconds")}


def test_a_study_runs_distill_lm_as_a_step_and_chooses_the_lowest_validation_perplexity(setup, tmp_path):
    """The study step ``distill_lm``: the run directory is distill-lm's own (equal to the command's run), the
    result is read back without training again, and the summary chooses each arm's rate on validation
    perplexity (the lowest) and compares the arms by seed. DKD on tokens trains through the same path."""
    import dataclasses

    import yaml

    from kdcollapse.study import load_study
    from kdcollapse.study._execute import execute, state_of
    from kdcollapse.study import collect, summarise

    root, options = setup
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(dataclasses.asdict(load_lm_config(None, [*options, "steps=2"]))))
    (tmp_path / "study.yaml").write_text(f"""
runs_dir: {tmp_path / 'runs'}
seeds: [0, 1]
groups:
  - group: grid
    run: "{{arm}}/lr{{lr}}/seed{{seed}}"
    step: distill_lm
    grid:
      lr: [0.01, 0.001]
      arm: [{{arm: ce, divergence: none, beta: null, ce: 1.0, distill: 0.0}},
            {{arm: dkd, divergence: dkd, beta: 2.0, ce: 0.0, distill: 1.0}}]
    params: &params {{config: {config}, loss.divergence: "{{divergence}}", loss.beta: "{{beta}}",
                      loss.ce_weight: "{{ce}}", loss.distill_weight: "{{distill}}", lr: "{{lr}}"}}
  - group: final
    run: "{{arm}}/lr{{lr}}/seed{{seed}}"
    step: distill_lm
    seeds: [2]
    choose: {{group: grid, per: [arm], by: val_perplexity, lowest: true}}
    params: *params
summary:
  select: null
  metric: {{metric: test_perplexity, at: last}}
  unit: perplexity
  columns: [{{metric: val_perplexity}}, {{metric: test_perplexity}}]
  sections:
    - title: dkd
      cells: [{{label: "dkd, lr {{lr}}", group: grid, where: {{arm: dkd}}}}, {{label: ce, group: grid, where: {{arm: ce, lr: 0.01}}}}]
      choose: {{among: "dkd, lr *", by: val_perplexity, lowest: true}}
      compare: [["{{chosen}}", ce]]
""")
    study = load_study(tmp_path / "study.yaml")
    assert {w[1]["arm"] for w in study.waiting} == {"ce", "dkd"}  # the group choice waits for the grid
    for run in study.runs.values():
        assert execute(run).status == "finished" and state_of(run) == "finished"
    # the group choice reads each step run's result.json (val_perplexity), the lowest per arm
    study = load_study(tmp_path / "study.yaml")
    grid = {n: json.loads((r.run_dir / "result.json").read_text())["val_perplexity"]
            for n, r in study.runs.items() if r.group == "grid"}
    best = {arm: min((0.01, 0.001), key=lambda lr: sum(grid[f"{arm}/lr{lr}/seed{s}"] for s in (0, 1)))
            for arm in ("ce", "dkd")}
    assert not study.waiting and sorted(n for n, r in study.runs.items() if r.group == "final") == \
        sorted(f"{arm}/lr{lr}/seed2" for arm, lr in best.items())
    result = json.loads((study.runs["dkd/lr0.01/seed1"].run_dir / "result.json").read_text())
    direct = distill_lm(load_lm_config(config, ["loss.divergence=dkd", "loss.beta=2.0", "lr=0.01", "seed=1",
                                                f"run_dir={tmp_path / 'direct'}"]), log=lambda *_: None)
    assert result["test_perplexity"] == direct["test_perplexity"] and result["val_perplexity"] == \
        direct["validation_perplexity"] and result["steps"] == 2 and result["student_parameters"] > 0
    assert execute(study.runs["dkd/lr0.01/seed1"]).status == "finished"  # read, not trained again
    records = collect(study)
    text, summary = summarise(study, records)
    from kdcollapse.runs import provenance  # a step run's record names its machine, as an epoch run's does
    machine = provenance()["hardware"]
    assert all(r["hardware"] == machine for r in records.values())
    assert f"Made on (the runs' run.json): {len(records)} runs on {machine['cpu']}" in text
    mean = {lr: sum(records[f"dkd/lr{lr}/seed{s}"]["last"]["val_perplexity"] for s in (0, 1)) for lr in (0.01, 0.001)}
    chosen = f"dkd, lr {min(mean, key=mean.get)}"
    assert f"(val_perplexity, seeds 0,1): {chosen}" in text
    assert summary["comparisons"][0]["a"] == chosen and summary["comparisons"][0]["seeds"] == [0, 1]


def test_a_smaller_teacher_k_is_cut_from_a_cached_store_without_loading_the_teacher(setup, monkeypatch):
    from kdcollapse.train import _lm_task as _lm

    root, options = setup
    distill_lm(load_lm_config(None, [*options, f"run_dir={root / 'k16'}", "steps=1"]), log=lambda *_: None)
    monkeypatch.setattr(_lm, "CUT_FROM", (16,))
    monkeypatch.setattr(_lm._Teacher, "model", property(lambda self: pytest.fail("the teacher was loaded")))
    record = distill_lm(load_lm_config(None, [*options, f"run_dir={root / 'k4'}", "steps=1", "teacher_k=4"]),
                        log=lambda *_: None)
    assert record["step"] == 1 and record["test_perplexity"] > 1


@pytest.mark.parametrize("stored", [True, False])
def test_a_bf16_teacher_gives_its_own_store_and_targets_near_the_float32_ones(setup, stored):
    """teacher_precision=bf16: a store of its own beside the float32 one (another cache key; the held-out
    references, the evaluation's teacher, shared), or the online teacher's body in bf16; the first step's loss
    within bf16 rounding of the float32 teacher's and not equal to it."""
    root, options = setup
    cache = next(o.split("=", 1)[1] for o in options if o.startswith("cache_dir="))
    where = ["teacher_k=16"] if stored else ["teacher_k=null"]
    losses = {}
    for precision in ("float32", "bf16"):
        cfg = load_lm_config(None, [*options, *where, f"run_dir={root / f'tp-{precision}-{stored}'}", "steps=1",
                                    "log_every=1", f"teacher_precision={precision}"])
        record = distill_lm(cfg, log=lambda *_: None)
        losses[precision] = json.loads((root / f"tp-{precision}-{stored}" / "steps.jsonl").read_text()
                                       .splitlines()[0])["train_loss"]
        assert record["test_perplexity"] > 1
    assert losses["bf16"] != losses["float32"] and losses["bf16"] == pytest.approx(losses["float32"], rel=1e-2)
    manifests = [json.loads(p.read_text()) for p in Path(cache).glob("teacher-tokens-*/manifest.json")]
    if stored:
        assert any(m.get("teacher_precision") == "bf16" for m in manifests)
        assert any("teacher_precision" not in m for m in manifests)
    assert len(list(Path(cache).glob("teacher-reference-*"))) == 2  # validation and test: one teacher evaluates


def test_a_bad_teacher_precision_is_one_line_naming_the_choices(setup, capsys):
    root, options = setup
    assert main(["distill-lm", *options, f"run_dir={root / 'tp-bad'}", "teacher_precision=fp16"]) == 2
    assert "'teacher_precision' must be one of float32, bf16; got 'fp16'" in capsys.readouterr().err
    assert not (root / "tp-bad").exists()


def test_a_dotted_student_override_changes_that_key_of_the_default_or_yaml_student(tmp_path):
    from kdcollapse.config_lm import SMALL_LLAMA

    cfg = load_lm_config(None, ["student.hidden_size=128", "student.num_hidden_layers=2"])
    assert cfg.student == {**SMALL_LLAMA, "hidden_size": 128, "num_hidden_layers": 2}
    assert load_lm_config(None, []).student == SMALL_LLAMA  # the default is not changed for the next config
    config = tmp_path / "lm.yaml"
    config.write_text("student: {model_type: llama, hidden_size: 64, num_hidden_layers: 1}\n")
    assert load_lm_config(config, ["student.hidden_size=32"]).student == {
        "model_type": "llama", "hidden_size": 32, "num_hidden_layers": 1}  # a YAML student replaces the default
    whole = {"model_type": "llama", "hidden_size": 16, "num_attention_heads": 2}
    assert load_lm_config(None, [f"student={json.dumps(whole)}", "student.num_hidden_layers=1"]).student == {
        **whole, "num_hidden_layers": 1}


# --- the shared run engine (issue 38): an LM run directory is a run directory like an image run's ----------

def test_an_lm_run_is_read_by_run_run_state_plot_and_its_commits_by_state_json(setup, tmp_path, capsys):
    """state.json commits each evaluated step (checkpoint and metrics files by digest); Run, run_state and
    `kdcollapse plot` read the run as they read an image run; per-step scalars are committed in steps.jsonl."""
    from kdcollapse.config_lm import LMConfig
    from kdcollapse.runs import Run, run_state
    from kdcollapse.runs._commit import file_digest, read_state

    root, options = setup
    run = tmp_path / "engine"
    distill_lm(load_lm_config(None, [*options, f"run_dir={run}", "log_every=1"]), log=lambda *_: None)
    state = read_state(run)
    assert state["epoch"] == 4 and {"checkpoint.safetensors", "metrics.jsonl", "metrics.csv", "steps.jsonl"} <= set(state["files"])
    for name, entry in state["files"].items():
        assert file_digest(run / name) == entry["sha256"], name
    opened = Run(run)
    assert isinstance(opened.config, LMConfig) and opened.task == "lm" and opened.config.steps == 4
    assert [r["step"] for r in opened.metrics()] == [2, 4] and opened.finished() and run_state(run) == "finished"
    assert [json.loads(x)["step"] for x in (run / "steps.jsonl").read_text().splitlines()] == [1, 2, 3, 4]
    with pytest.raises(Exception, match="student"):
        opened.model()
    assert json.loads((run / "run.json").read_text())["task"] == "lm"
    pytest.importorskip("matplotlib")
    capsys.readouterr()
    assert main(["plot", str(run), "--keys", "validation_perplexity,train_loss", "--out", str(tmp_path / "c.png")]) == 0
    assert (tmp_path / "c.png").stat().st_size > 0


def test_a_run_of_the_older_lm_format_is_refused_with_one_line_saying_what_to_do(setup, tmp_path, capsys):
    from kdcollapse.runs import save_tensors

    root, options = setup
    old = tmp_path / "old"
    old.mkdir()
    (old / "config.yaml").write_text("teacher: t\nstudent: {model_type: llama}\nloss: {divergence: jsd, weight: 0.5}\n")
    save_tensors(old / "checkpoint.safetensors", {"student.w": torch.zeros(1)},
                 {"format": "kdcollapse.lm_checkpoint", "step": 2})
    before = {p.name: p.read_bytes() for p in old.iterdir()}
    assert main(["distill-lm", "--resume", str(old)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "kdcollapse.lm_checkpoint" in err[0] and "--overwrite" in err[0], err
    assert {p.name: p.read_bytes() for p in old.iterdir()} == before


@pytest.mark.slow
@pytest.mark.parametrize("across_tokenizers", [False, True], ids=["one_tokenizer", "across_tokenizers"])
def test_kill_9_during_an_lm_run_then_a_second_process_and_resume_bit_for_bit(setup, tmp_path, capsys,
                                                                             across_tokenizers):
    """A real SIGKILL after the first committed step; meanwhile (the first process frozen, holding its lock) a
    second process is refused; the resume ends in the same metrics and student as an uninterrupted run. Also
    across tokenizers (a student with a BPE of its own, ULD, the teacher online)."""
    import signal
    import time

    from ranks import Forked

    root, options = setup
    common = [*options, "steps=40", "eval_every=1", "progress=false"]
    if across_tokenizers:
        tiny_tokenizer(420).save_pretrained(tmp_path / "student-tokenizer")
        common += [f"student_tokenizer={tmp_path / 'student-tokenizer'}", "teacher_k=null", "loss.divergence=uld"]
    run = tmp_path / "killed"
    proc = Forked(["distill-lm", *common, f"run_dir={run}"], tmp_path / "first.err")
    try:
        deadline = time.time() + 120
        while not (run / "checkpoint.safetensors").exists():
            assert proc.poll() is None and time.time() < deadline, proc.stderr()[-2000:]
            time.sleep(0.01)
        proc.send_signal(signal.SIGSTOP)
        capsys.readouterr()
        assert main(["distill-lm", *common, f"run_dir={run}", "--overwrite"]) == 2
        assert f"is in use by another process (pid {proc.pid}" in capsys.readouterr().err
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr()[-2000:]
    assert main(["distill-lm", "--resume", str(run)]) == 0
    distill_lm(load_lm_config(None, [*common, f"run_dir={tmp_path / 'straight'}"]), log=lambda *_: None)

    def records(d):
        return [{k: v for k, v in json.loads(x).items() if k != "step_seconds"}
                for x in (d / "metrics.jsonl").read_text().splitlines()]

    assert records(run) == records(tmp_path / "straight") and len(records(run)) == 40
    a = lm.load_language_model(run / "student").model.state_dict()
    for name, value in lm.load_language_model(tmp_path / "straight" / "student").model.state_dict().items():
        assert torch.equal(a[name], value), name


MY_DIVERGENCE = '''
import math

import torch

import kdcollapse.train  # noqa: F401  (a user's module may import kdcollapse first: config_lm is loaded then)
from kdcollapse.losses._catalog import register_loss
from kdcollapse.losses._divergence import Divergence, Parameter


@register_loss("my_skew_kl", kind="logits", paper="a user's divergence", equation="KL(p || lam p + (1-lam) q)",
               temperature=True, sequences=True, ignore_index=False, chunked=True,
               example=lambda k, y: {"lam": 0.3},
               divergence=Divergence(parameters={"lam": Parameter(0.1, 0.0, 0.9, meaning="teacher share")}))
def _my_skew_kl(log_q, log_p, lam):
    log_m = torch.logaddexp(log_p + math.log(lam) if lam > 0 else torch.full_like(log_p, -math.inf),
                            log_q + math.log(1 - lam))
    return (log_p.exp() * (log_p - log_m)).sum(-1)
'''


@pytest.mark.slow
def test_a_divergence_declared_by_an_import_module_gets_its_loss_keys(setup, tmp_path):
    """A token divergence declared in a user's module (``--import``, registered after kdcollapse.config_lm was
    imported) brings its ``loss.<parameter>`` keys to distill-lm's config: read from the registry when the
    config loads, its range checked there (one error line, exit 2, nothing written), and a run trains with it.
    In one subprocess, so the declaration does not reach this process's registry-driven tests: the CLI's
    ``main`` runs there once per command line, the first without ``--import`` (the key is unknown then)."""
    import os
    import subprocess
    import sys

    root, options = setup
    (tmp_path / "my_divergence.py").write_text(MY_DIVERGENCE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path])}
    common = [*options, "steps=2", "loss.divergence=my_skew_kl"]
    argvs = [["distill-lm", *options, "steps=2", f"run_dir={tmp_path / 'none'}", "loss.lam=0.3"],
             *(["--import", "my_divergence", "distill-lm", *common, *extra] for extra in (
                 [f"run_dir={tmp_path / 'bad'}", "loss.lam=2"], [f"run_dir={tmp_path / 'bad'}", "loss.lamb=0.3"],
                 [f"run_dir={tmp_path / 'good'}", "loss.lam=0.3"]))]
    ran = subprocess.run([sys.executable, "-c", _MAINS, json.dumps(argvs)], env=env, capture_output=True, text=True,
                         timeout=300)
    assert ran.returncode == 0, ran.stderr[-2000:]
    without, bad, unknown, good = [json.loads(x.removeprefix("MAIN ")) for x in ran.stdout.splitlines()
                                   if x.startswith("MAIN ")]
    assert without["status"] == 2 and "unknown key 'loss.lam'" in without["stderr"], without  # not imported
    assert bad["status"] == 2 and bad["stderr"].startswith("error: ") and bad["stderr"].count("\n") == 1, bad
    assert "lam" in bad["stderr"] and "0.9" in bad["stderr"] and not (tmp_path / "bad").exists()
    assert unknown["status"] == 2 and "unknown key 'loss.lamb'" in unknown["stderr"], unknown
    assert good["status"] == 0, good["stderr"][-2000:]
    saved = (tmp_path / "good" / "config.yaml").read_text()
    assert "divergence: my_skew_kl" in saved and "lam: 0.3" in saved
    assert [json.loads(x)["step"] for x in (tmp_path / "good" / "metrics.jsonl").read_text().splitlines()] == [2]


# The CLI's main once per command line (argv lists, JSON in argv[1]) in one interpreter: exit status and stderr.
_MAINS = """
import contextlib, io, json, sys
from kdcollapse.cli import main
for argv in json.loads(sys.argv[1]):
    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        status = main(argv)
    print("MAIN " + json.dumps({"status": status, "stderr": err.getvalue()}), flush=True)
"""


def test_a_study_evaluates_the_teacher_once_and_its_page_shows_the_gap_each_arm_closes(setup, tmp_path):
    """The run step ``teacher_lm`` evaluates the config's teacher as its students are (same test blocks, same
    evaluation: its perplexity by hand here); a section's ``gap`` gives each arm's fraction of the gap from the
    cross-entropy student to the teacher closed, per seed in log perplexity, mean ± std, from the records."""
    import dataclasses
    import math

    import yaml

    from kdcollapse.errors import ConfigError
    from kdcollapse.study import collect, load_study, summarise
    from kdcollapse.study._execute import execute
    from kdcollapse.train._lm_task import LMTask

    root, options = setup
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(dataclasses.asdict(load_lm_config(None, [*options, "steps=2"]))))
    study_text = f"""
runs_dir: {tmp_path / 'runs'}
seeds: [0, 1]
groups:
  - {{group: teacher, run: "teacher/seed{{seed}}", step: teacher_lm, seeds: [0], params: {{config: {config}}}}}
  - group: arms
    run: "{{arm}}/seed{{seed}}"
    step: distill_lm
    grid:
      arm: [{{arm: ce, divergence: none, ce: 1.0, distill: 0.0}}, {{arm: fkl, divergence: forward_kl, ce: 0.0, distill: 1.0}}]
    params: {{config: {config}, loss.divergence: "{{divergence}}", loss.ce_weight: "{{ce}}",
              loss.distill_weight: "{{distill}}", lr: 0.01}}
summary:
  select: null
  metric: {{metric: test_perplexity, at: last}}
  unit: perplexity
  better: lower
  columns: [{{metric: test_perplexity}}]
  sections:
    - title: arms
      cells: [{{label: the teacher, short: teacher, group: teacher}}, {{label: "{{arm}}", short: "{{arm}}", group: arms}}]
      gap: {{to: teacher, from: ce, metric: test_perplexity, log: true, label: gap to the teacher closed}}
"""
    (tmp_path / "study.yaml").write_text(study_text)
    study = load_study(tmp_path / "study.yaml")
    for run in study.runs.values():
        assert execute(run).status == "finished"
    teacher = json.loads((study.runs["teacher/seed0"].run_dir / "result.json").read_text())
    task = LMTask(load_lm_config(config, []))
    task.prepare()
    model = lm.load_language_model(root / "teacher").model.eval()
    ids, mask = task.held_out["test"], task.held_out_masks["test"]
    with torch.no_grad():
        logits = model(ids).logits[:, :-1].float()
    ce = torch.nn.functional.cross_entropy(logits[mask], ids[:, 1:][mask])
    assert teacher["test_perplexity"] == pytest.approx(math.exp(float(ce)), rel=1e-5)
    assert teacher["test_agreement"] == 1.0 and teacher["val_perplexity"] > 1 and teacher["cpu_seconds"] > 0
    text, summary = summarise(study, collect(study))
    result = {name: json.loads((r.run_dir / "result.json").read_text())["test_perplexity"]
              for name, r in study.runs.items()}
    log_t = math.log(teacher["test_perplexity"])
    expected = [(math.log(result[f"ce/seed{s}"]) - math.log(result[f"fkl/seed{s}"]))
                / (math.log(result[f"ce/seed{s}"]) - log_t) for s in (0, 1)]
    (gap,) = summary["sections"][0]["gap_closed"]
    assert gap["cell"] == "fkl" and gap["seeds"] == [0, 1] and gap["per_seed"] == pytest.approx(expected)
    assert gap["mean"] == pytest.approx(sum(expected) / 2)
    assert "gap to the teacher closed (log test_perplexity at last epoch; 0 = ce, 1 = teacher)" in text
    # while the reference's runs have not finished, the page has no gap (and no error): a partial study renders
    partial = {name: r for name, r in collect(study).items() if not name.startswith("ce/")}
    assert "gap_closed" not in summarise(study, partial)[1]["sections"][0]
    (tmp_path / "study.yaml").write_text(study_text.replace("from: ce,", "from: nothing,"))
    with pytest.raises(ConfigError, match="gap 'from' 'nothing' is not one of its cells"):
        summarise(load_study(tmp_path / "study.yaml"), collect(study))
    (tmp_path / "study.yaml").write_text(study_text.replace("from: ce,", "form: ce,"))
    with pytest.raises(ConfigError, match="'gap' is"):
        load_study(tmp_path / "study.yaml")


def test_a_distill_lm_run_step_takes_the_post_step_lm_collapse_on_its_own_test_tokens(setup, tmp_path):
    """``post: [{step: lm_collapse, ...}]`` on a ``distill_lm`` group: the student's next-token collapse per
    hidden state on the run's test blocks (its perplexity is the run's test perplexity: the same positions),
    read by the summary as the run's numbers; a command post step is refused for a run step."""
    import dataclasses

    import yaml

    from kdcollapse.errors import ConfigError
    from kdcollapse.study import collect, load_study
    from kdcollapse.study._execute import execute, pending

    root, options = setup
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(dataclasses.asdict(load_lm_config(None, [*options, "steps=2"]))))
    text = f"""
runs_dir: {tmp_path / 'runs'}
seeds: [0]
groups:
  - {{group: arms, run: "ce/seed{{seed}}", step: distill_lm, params: {{config: {config}, loss.divergence: none,
      loss.ce_weight: 1.0, loss.distill_weight: 0.0}}, post: [{{step: lm_collapse, creates: lm_collapse.json}}]}}
summary:
  select: null
  metric: {{metric: test_perplexity, at: last}}
  unit: perplexity
  columns: [{{metric: test_perplexity}}, {{metric: perplexity}}, {{metric: layers/1/nc1}}, {{metric: parameters}}]
  sections: [{{title: arms, cells: [{{label: ce, group: arms}}]}}]
"""
    (tmp_path / "study.yaml").write_text(text)
    study = load_study(tmp_path / "study.yaml")
    (run,) = study.runs.values()
    assert execute(run).status == "finished" and not pending(study)
    measured = json.loads((run.run_dir / "lm_collapse.json").read_text())
    result = json.loads((run.run_dir / "result.json").read_text())
    assert measured["perplexity"] == pytest.approx(result["test_perplexity"], rel=1e-5)
    assert set(measured["layers"]) == {"0", "1"} and "gnc2" in measured["layers"]["1"]
    assert measured["last"] == measured["layers"]["1"]  # the last hidden state, one key at any depth
    assert measured["parameters"] == result["student_parameters"]
    (last,) = (r["last"] for r in collect(study).values())
    assert last["layers/1/nc1"] == measured["layers"]["1"]["nc1"] and last["perplexity"] == measured["perplexity"]
    (tmp_path / "study.yaml").write_text(text.replace("{step: lm_collapse, creates: lm_collapse.json}",
                                                      "{command: analyze, args: [], creates: a.json}"))
    with pytest.raises(ConfigError, match="its post steps are registered steps"):
        load_study(tmp_path / "study.yaml")
