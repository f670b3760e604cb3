"""What a distill-lm run compares its student with: the evaluation against the whole teacher (its stored hidden
states and head on the held-out blocks, never a top-k store), the rule ``teacher_tail`` by which a loss reads the
stored training tokens, and what a top-k store keeps of the teacher (``top_k_costs``). On a tiny random teacher,
tokenizer and corpus."""

import math

import pytest
import torch
import torch.nn.functional as F

from kdcollapse import lm
from kdcollapse.errors import ConfigError
from kdcollapse.losses import TopKTeacher, fused_head_loss
from kdcollapse.train import load_lm_config

pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
from tiny_lm import distill_lm_files  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm_tail")
    _, files = distill_lm_files(root)
    options = [*files, "block_size=8", "train_blocks=40", "eval_blocks=4", "batch_size=4", "steps=2", "eval_every=2",
               "warmup=1", "teacher_k=16", "chunk_size=10", f"cache_dir={root / 'cache'}"]
    return root, options


def student_of(root):
    student = lm.load_language_model(root / "teacher").model
    g = torch.Generator().manual_seed(0)
    for parameter in student.parameters():  # so that student and teacher differ clearly
        parameter.data.add_(torch.randn(parameter.shape, generator=g) * 0.2 * parameter.data.std())
    return student


def test_the_evaluation_compares_with_the_whole_teacher(setup):
    """Forward KL and agreement equal those computed from the teacher's own logits over the whole vocabulary;
    the teacher against itself: agreement 1, forward KL 0."""
    from kdcollapse.train import LMTask
    from kdcollapse.train._lm_task import evaluate

    root, options = setup
    task = LMTask(load_lm_config(None, [*options, "run_dir=unused"]))
    task.prepare()
    blocks, mask = task.held_out["test"], task.held_out_masks["test"]
    student, teacher = student_of(root), task.teacher.model
    got = evaluate(student, blocks, task.references["test"], task.cfg, mask=mask)
    with torch.no_grad():
        q = student(blocks).logits[:, :-1].reshape(-1, 300)[mask.reshape(-1)].double().log_softmax(-1)
        p = teacher(blocks).logits[:, :-1].reshape(-1, 300)[mask.reshape(-1)].double().log_softmax(-1)
    assert got["forward_kl"] == pytest.approx(float((p.exp() * (p - q)).sum(-1).mean()), rel=1e-4)
    assert got["agreement"] == pytest.approx(float((q.argmax(-1) == p.argmax(-1)).double().mean()))
    itself = evaluate(teacher, blocks, task.references["test"], task.cfg, mask=mask)
    assert itself["agreement"] == 1.0 and abs(itself["forward_kl"]) < 1e-5


def test_teacher_tail_rest_is_the_coarsened_loss_of_the_stored_tokens(setup):
    """A micro-batch's loss under ``teacher_tail=rest`` is the fused loss with the stored rows read by the rule
    "rest", which differs from the uniform rule's."""
    from kdcollapse.train import LMTask
    from kdcollapse.train._lm_task import _loss

    root, options = setup
    losses = {}
    for tail in ("uniform", "rest"):
        task = LMTask(load_lm_config(None, [*options, "run_dir=unused", f"teacher_tail={tail}"]))
        task.prepare()
        student, micro = student_of(root), torch.tensor([3, 1, 7, 0])
        losses[tail] = _loss(task.cfg, student, task.teacher, task.train, task.stored, micro, torch.Generator(), None)
        rows = task.stored.rows(micro, slice(None, -1))
        rows = TopKTeacher(rows.log_probs_topk, rows.indices, rows.log_rest, rows.temperature, tail)
        with torch.no_grad():
            hidden = student.base_model(task.train[micro]).last_hidden_state[:, :-1]
        want = fused_head_loss(hidden.reshape(-1, hidden.shape[-1]), student.get_output_embeddings().weight, rows,
                               chunk_size=10)
        torch.testing.assert_close(losses[tail].detach(), want.detach())
    assert float(losses["rest"].detach()) < float(losses["uniform"].detach())  # the rest's mass as one outcome: a coarser, smaller KL


def test_top_k_costs_are_nothing_at_k_equal_to_v_and_the_uniform_tails_perplexity_by_hand(setup):
    from kdcollapse.train import LMTask
    from kdcollapse.train._lm_task import top_k_costs

    root, options = setup
    task = LMTask(load_lm_config(None, [*options, "run_dir=unused"]))
    task.prepare()
    blocks, mask, teacher = task.held_out["test"], task.held_out_masks["test"], task.teacher.model
    whole = top_k_costs(teacher, blocks, 300, mask=mask)
    perplexity = task.evaluate(teacher)["test_perplexity"]
    assert whole["top_k_coverage"] == 1.0 and whole["tail_mass"] == 0.0 and abs(whole["uniform_tail_kl"]) < 1e-6
    assert whole["uniform_tail_perplexity"] == pytest.approx(perplexity, rel=1e-5)
    costs = top_k_costs(teacher, blocks, 5, mask=mask)
    with torch.no_grad():
        p = teacher(blocks).logits[:, :-1].reshape(-1, 300)[mask.reshape(-1)].double().softmax(-1)
    labels = blocks[:, 1:].reshape(-1)[mask.reshape(-1)]
    top = p.topk(5, -1).indices
    inside = (top == labels.unsqueeze(1)).any(1)
    rest = 1 - p.gather(1, top).sum(-1)
    flat = torch.where(inside, p.gather(1, labels.unsqueeze(1)).squeeze(1), rest / 295)
    assert costs["top_k_coverage"] == pytest.approx(float(inside.double().mean()))
    assert costs["tail_mass"] == pytest.approx(float(rest.mean()), rel=1e-5)
    assert costs["uniform_tail_perplexity"] == pytest.approx(math.exp(float(-flat.log().mean())), rel=1e-4)
    assert costs["uniform_tail_perplexity"] > perplexity and costs["uniform_tail_kl"] > 0


def test_a_bad_teacher_tail_is_one_error_naming_the_rules(setup):
    _, options = setup
    with pytest.raises(ConfigError, match="'teacher_tail' must be one of uniform, rest; got 'flat'"):
        load_lm_config(None, [*options, "teacher_tail=flat"])
    with pytest.raises(ConfigError, match="teacher_tail=rest reads stored top-k teacher tokens"):
        load_lm_config(None, [*options, "teacher_tail=rest", "teacher_k=null"])


def test_a_damaged_teacher_reference_is_refused(setup, tmp_path):
    from kdcollapse.errors import DataError

    root, _ = setup
    model = lm.load_language_model(root / "teacher").model
    blocks = torch.randint(0, 300, (3, 8), generator=torch.Generator().manual_seed(1))
    directory = lm.store_teacher_reference(model, blocks, tmp_path / "ref")
    reference = lm.TeacherReference.load(directory)
    with torch.no_grad():
        want = F.log_softmax(model(blocks).logits.float(), -1).reshape(-1, 300)
    torch.testing.assert_close(reference.rows(torch.arange(3)).log_probs(slice(None), 300, 1.0), want,
                               rtol=1e-5, atol=1e-5)
    data = bytearray((directory / "reference.safetensors").read_bytes())
    data[-1] ^= 1
    (directory / "reference.safetensors").write_bytes(bytes(data))
    with pytest.raises(DataError, match="missing or damaged"):
        lm.TeacherReference.load(directory)


def test_prepare_only_caches_what_a_run_reads_and_writes_no_run_directory(tmp_path, monkeypatch, capsys):
    """After ``distill-lm --prepare-only``, a run of the same config trains without loading the teacher (its stored
    tokens and its reference are cached)."""
    from kdcollapse.cli import main
    from kdcollapse.train import _lm_task, distill_lm

    _, files = distill_lm_files(tmp_path)
    options = [*files, "block_size=8", "train_blocks=40", "eval_blocks=4", "batch_size=4", "steps=1", "eval_every=1",
               "warmup=0", "teacher_k=16", f"cache_dir={tmp_path / 'cache'}", f"run_dir={tmp_path / 'run'}"]
    assert main(["distill-lm", "--prepare-only", *options]) == 0
    assert "the teacher's top-16 tokens of 40 training blocks" in capsys.readouterr().out
    assert not (tmp_path / "run").exists()
    monkeypatch.setattr(_lm_task._Teacher, "model", property(lambda self: pytest.fail("the teacher was loaded")))
    assert distill_lm(load_lm_config(None, options), log=lambda *_: None)["test_perplexity"] > 1


def test_steps_zero_evaluates_and_saves_the_initialisation(setup):
    """``steps=0``: nothing trained; the student as initialised (a random config's at the run's seed) evaluated,
    committed as step 0 (the run is finished) and saved, so that analysis and the studies measure it as they
    measure a trained one."""
    from kdcollapse.runs import run_state
    from kdcollapse.train import LMTask, distill_lm
    from kdcollapse.train._lm_task import evaluate

    root, options = setup
    cfg = load_lm_config(None, [*options, f"run_dir={root / 'init'}", "steps=0", "warmup=0", "seed=3"])
    record = distill_lm(cfg, log=lambda *_: None)
    assert record["step"] == 0 and "train_loss" not in record and run_state(root / "init") == "finished"
    saved = lm.load_language_model(root / "init" / "student").model
    task = LMTask(cfg)
    task.prepare()
    fresh = lm.load_language_model({"vocab_size": len(task.tokenizer), **cfg.student}, tokenizer=task.tokenizer,
                                   seed=3).model
    for (name, a), (_, b) in zip(saved.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
    direct = evaluate(fresh, task.held_out["test"], task.references["test"], cfg, mask=task.held_out_masks["test"])
    assert record["test_perplexity"] == pytest.approx(direct["perplexity"], rel=1e-6)
    assert distill_lm(cfg, resume=True, log=lambda *_: None)["test_perplexity"] == record["test_perplexity"]
    with pytest.raises(ConfigError, match="'warmup' must be an int in \\[0, steps=0\\]"):
        load_lm_config(None, [*options, "steps=0", "warmup=1"])
    with pytest.raises(ConfigError, match="'steps' must be an int >= 0"):
        load_lm_config(None, [*options, "steps=-1"])


def test_the_teacher_and_an_initialisation_take_the_post_step_lm_collapse(setup, tmp_path):
    """``lm_collapse`` measures a ``teacher_lm`` run's teacher and a ``steps=0`` run's initialisation on their
    test blocks (each perplexity equal to the run's own): the reference points of a study's collapse relation."""
    import dataclasses
    import json

    import yaml

    from kdcollapse.study import collect, load_study
    from kdcollapse.study._execute import execute

    _, options = setup
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(dataclasses.asdict(load_lm_config(None, [*options, "steps=2"]))))
    (tmp_path / "study.yaml").write_text(f"""
runs_dir: {tmp_path / 'runs'}
seeds: [0]
groups:
  - {{group: teacher, run: "teacher/seed{{seed}}", step: teacher_lm, params: {{config: {config}}},
     post: [{{step: lm_collapse, creates: lm_collapse.json}}]}}
  - {{group: init, run: "init/seed{{seed}}", step: distill_lm, params: {{config: {config}, steps: 0, warmup: 0,
      loss.divergence: none, loss.ce_weight: 1.0, loss.distill_weight: 0.0}},
     post: [{{step: lm_collapse, creates: lm_collapse.json}}]}}
summary:
  select: null
  metric: {{metric: test_perplexity, at: last}}
  unit: perplexity
  columns: [{{metric: test_perplexity}}, {{metric: last/nc1}}]
  sections: [{{title: references, cells: [{{label: teacher, group: teacher}}, {{label: init, group: init}}]}}]
""")
    study = load_study(tmp_path / "study.yaml")
    for run in study.runs.values():
        assert execute(run).status == "finished"
        measured = json.loads((run.run_dir / "lm_collapse.json").read_text())
        result = json.loads((run.run_dir / "result.json").read_text())
        assert measured["perplexity"] == pytest.approx(result["test_perplexity"], rel=1e-5)
        assert measured["last"]["nc1"] > 0
    records = collect(study)
    assert records["teacher/seed0"]["last"]["last/nc1"] != records["init/seed0"]["last"]["last/nc1"]


def test_a_post_step_of_a_language_model_run_records_the_students_digest(setup, tmp_path):
    """``lm_collapse.json`` is listed in the run's outputs with the digest of ``student/``; once the student holds
    other weights the output is stale and the study's records refuse it."""
    import dataclasses
    import json

    import yaml

    from kdcollapse.errors import CheckpointError
    from kdcollapse.runs import outputs_stale
    from kdcollapse.study import collect, load_study
    from kdcollapse.study._execute import execute

    _, options = setup
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(dataclasses.asdict(load_lm_config(None, [*options, "steps=0", "warmup=0"]))))
    (tmp_path / "study.yaml").write_text(f"""
runs_dir: {tmp_path / 'runs'}
seeds: [0]
groups:
  - {{group: init, run: "init/seed{{seed}}", step: distill_lm, params: {{config: {config}, loss.divergence: none,
      loss.ce_weight: 1.0, loss.distill_weight: 0.0}}, post: [{{step: lm_collapse, creates: lm_collapse.json}}]}}
summary:
  select: null
  metric: {{metric: test_perplexity, at: last}}
  unit: perplexity
  columns: [{{metric: test_perplexity}}, {{metric: last/nc1}}]
  sections: [{{title: init, cells: [{{label: init, group: init}}]}}]
""")
    study = load_study(tmp_path / "study.yaml")
    (run,) = study.runs.values()
    assert execute(run).status == "finished"
    source = json.loads((run.run_dir / "outputs.json").read_text())["lm_collapse.json"]["source"]
    assert source["lm_dir"] == "student" and len(source["lm_sha256"]) == 64
    assert outputs_stale(run.run_dir) == {} and "last/nc1" in collect(study)["init/seed0"]["last"]
    weights = run.run_dir / "student" / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-1] ^= 1
    weights.write_bytes(bytes(data))
    assert "lm_collapse.json" in outputs_stale(run.run_dir)
    with pytest.raises(CheckpointError, match="lm_collapse.json is stale"):
        collect(study)


def test_lm_against_pairs_a_student_of_the_teachers_layers_with_the_teacher_after_the_same_layer(tmp_path):
    """The post step ``lm_against``: a student that copies every teacher layer is the teacher (CKA and the class
    means' Procrustes alignment 1 at every pair, agreement 1); one of layers [0, 2] has the teacher's hidden state
    after layer 0 exactly (pair 1 ↔ 1) and a different one after layer 2 (pair 2 ↔ 3)."""
    import json

    from kdcollapse.analysis._stages import kept_pairs
    from kdcollapse.errors import KdcollapseError
    from kdcollapse.study._steps import lm_against
    from kdcollapse.train import distill_lm

    _, files = distill_lm_files(tmp_path, teacher_layers=3)
    base = [*files, "block_size=8", "train_blocks=40", "eval_blocks=4", "batch_size=4", "steps=0", "warmup=0",
            "loss.divergence=none", "loss.ce_weight=1", "loss.distill_weight=0"]
    measured = {}
    for name, layers in (("copy", [0, 1, 2]), ("pruned", [0, 2])):
        student = json.dumps({"init": {"from": "teacher", "layers": layers}})
        distill_lm(load_lm_config(None, [*base, f"student={student}", f"run_dir={tmp_path / name}"]),
                   log=lambda *_: None)
        measured[name] = lm_against(tmp_path / name)
    copy, pruned = measured["copy"], measured["pruned"]
    assert copy["agreement"] == 1.0 and [copy["layers"][str(i)]["teacher_state"] for i in range(4)] == [0, 1, 2, 3]
    for values in copy["layers"].values():
        assert values["feature_cka"] == pytest.approx(1, abs=1e-6)
        assert values["procrustes_alignment"] == pytest.approx(1, abs=1e-6)
    assert [pruned["layers"][str(i)]["teacher_state"] for i in range(3)] == [0, 1, 3]
    assert pruned["layers"]["1"]["feature_cka"] == pytest.approx(1, abs=1e-6)
    assert pruned["layers"]["2"]["feature_cka"] < 1 - 1e-3 and pruned["last"] == pruned["layers"]["2"]
    from kdcollapse.cli import main

    argv = ["analyze", "--lm", str(tmp_path / "pruned" / "student"), "--against", str(tmp_path / "teacher"),
            "--corpus", str(tmp_path / "corpus"), "--split", "train", "--block-size", "8", "--layers", "all",
            "--no-progress", "--kept-layers", "run", "--out", str(tmp_path / "vs")]
    assert main(argv) == 0
    assert set(json.loads((tmp_path / "vs" / "against.json").read_text())["layers"]) == {"0/0", "1/1", "2/3"}
    given = [*argv[:-4], "--kept-layers", "0,2", "--out", str(tmp_path / "vs2")]
    assert main(given) == 0
    assert json.loads((tmp_path / "vs2" / "against.json").read_text())["layers"].keys() == {"0/0", "1/1", "2/3"}
    assert main([*argv[:-4], "--kept-layers", "0,1,2", "--out", str(tmp_path / "vs3")]) == 2  # 3 for 2 layers
    assert main([*argv[:-4], "--out", str(tmp_path / "vs4"), "--kept-layers", "run"][:-2] + ["--kept-layers", "x"]) == 2
    assert kept_pairs([4, 20], 31) == [(0, 0), (1, 5), (2, 21)]
    with pytest.raises(KdcollapseError, match="not increasing decoder layers of a teacher of 30 layers"):
        kept_pairs([3, 30], 31)
