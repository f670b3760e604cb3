"""``analyze --lm STUDENT --against TEACHER``: a language model's next-token geometry against another's, layer
pair by layer pair (kdcollapse.analysis.analyze_tokens_against), against features gathered by hand, against
itself (alignment 1), and on a real ``distill-lm`` run of a tiny teacher and student."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from kdcollapse.analysis import analyze_tokens_against, token_classes
from kdcollapse.errors import KdcollapseError

transformers = pytest.importorskip("transformers")
from test_tokens import VOCAB, corpus  # noqa: E402


def llama(layers: int, hidden: int, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=2 * hidden,
                                      num_hidden_layers=layers, num_attention_heads=2, num_key_value_heads=1,
                                      max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def gathered(model, batches, layer, classes):
    """The hidden states of ``layer`` at the kept positions and their classes, gathered by hand."""
    feats, labels = [], []
    for batch in batches:
        with torch.no_grad():
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
        nxt = batch["labels"][:, 1:]
        keep = (nxt != -100) & batch["attention_mask"][:, 1:].bool()
        cls = classes.index[nxt.clamp_min(0)]
        keep &= cls >= 0
        feats.append(out.hidden_states[layer][:, :-1][keep].double())
        labels.append(cls[keep])
    return torch.cat(feats), torch.cat(labels)


def procrustes(a: np.ndarray, b: np.ndarray) -> float:
    """max over orthogonal Q of <A Q, B> / (|A| |B|): the nuclear norm of A^T B over the norms."""
    return float(np.linalg.svd(a.T @ b, compute_uv=False).sum() / (np.linalg.norm(a) * np.linalg.norm(b)))


def linear_cka(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(0), y - y.mean(0)
    return float(np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


def test_each_layer_pair_equals_the_definitions_on_features_gathered_by_hand():
    student, teacher = llama(2, 16, seed=0), llama(4, 24, seed=1)
    batches = corpus(seed=3)
    result = analyze_tokens_against(student, teacher, batches, layers="all", min_count=2)
    # relative depth: student 0, 1, 2 of 2 -> teacher 0, 2, 4 of 4
    assert set(result["layers"]) == {"0/0", "1/2", "2/4"}
    classes = token_classes(batches, VOCAB, min_count=2)
    for name, values in result["layers"].items():
        i, j = (int(v) for v in name.split("/"))
        hs, y = gathered(student, batches, i, classes)
        ht, _ = gathered(teacher, batches, j, classes)
        means = [np.stack([h[y == k].mean(0).numpy() for k in range(classes.num_classes)]) for h in (hs, ht)]
        centred = [m - m.mean(0) for m in means]
        assert values["procrustes_alignment"] == pytest.approx(procrustes(*centred), rel=1e-9)
        assert values["feature_cka"] == pytest.approx(linear_cka(hs.numpy(), ht.numpy()), rel=1e-6, abs=1e-9)
        assert ("classifier_procrustes_alignment" in values) == (name == "2/4")
    positions = agree = 0
    for batch in batches:
        with torch.no_grad():
            zs = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
            zt = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]
        nxt = batch["labels"][:, 1:]
        keep = (nxt != -100) & batch["attention_mask"][:, 1:].bool() & (classes.index[nxt.clamp_min(0)] >= 0)
        positions += int(keep.sum())
        agree += int((zs.argmax(-1) == zt.argmax(-1))[keep].sum())
    assert result["positions"] == positions and result["agreement"] == pytest.approx(agree / positions)


def test_a_model_against_itself_is_aligned_and_a_vocabulary_mismatch_is_refused():
    model = llama(2, 16, seed=0)
    result = analyze_tokens_against(model, model, corpus(seed=1), layers="last")
    (values,) = result["layers"].values()
    assert values["procrustes_alignment"] == pytest.approx(1.0, abs=1e-9)
    assert values["feature_cka"] == pytest.approx(1.0, abs=1e-9)
    assert values["classifier_procrustes_alignment"] == pytest.approx(1.0, abs=1e-9)
    assert values["simplex_angle"] == pytest.approx(0.0, abs=1e-3)
    assert result["agreement"] == 1.0
    other = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=VOCAB + 1, hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=64))
    with pytest.raises(KdcollapseError, match="has 11 rows, the teacher.s 12"):
        analyze_tokens_against(model, other, corpus(seed=1))


def test_the_command_on_a_distill_lm_run_against_its_teacher(tmp_path, monkeypatch, capsys):
    from tiny_lm import llama_config, tiny_tokenizer, write_corpus

    from kdcollapse import lm
    from kdcollapse.cli import main
    from kdcollapse.runs import read_outputs

    monkeypatch.setenv("KDCOLLAPSE_CACHE", str(tmp_path / "cache"))
    tokenizer = tiny_tokenizer()
    teacher = tmp_path / "teacher"
    lm.load_language_model(llama_config(len(tokenizer), hidden=48), tokenizer=tokenizer, seed=0).model.save_pretrained(
        teacher)
    tokenizer.save_pretrained(teacher)
    text = write_corpus(tmp_path / "corpus", copies=6)
    student = {k: v for k, v in llama_config(len(tokenizer), hidden=16, layers=1).items() if k != "vocab_size"}
    run = tmp_path / "run"
    assert main(["distill-lm", f"teacher={teacher}", f"corpus={text}", f"cache_dir={tmp_path / 'cache'}",
                 f"student={json.dumps(student)}", "block_size=8", "train_blocks=16", "eval_blocks=2",
                 "batch_size=4", "steps=2", "eval_every=2", "warmup=1", "teacher_k=16", "chunk_size=10",
                 f"run_dir={run}"]) == 0
    out = run / "against_teacher"
    argv = ["analyze", "--lm", str(run / "student"), "--against", str(teacher), "--corpus", str(text),
            "--split", "train", "--block-size", "16", "--layers", "all", "--no-progress", "--out", str(out)]
    assert main(argv) == 0
    result = json.loads((out / "against.json").read_text())
    assert set(result["layers"]) == {"0/0", "1/2"}  # a 1-layer student against a 2-layer teacher
    assert 0 < result["layers"]["1/2"]["procrustes_alignment"] <= 1 + 1e-9
    assert "classifier_procrustes_alignment" in result["layers"]["1/2"]
    assert "| 1/2 |" in (out / "against.md").read_text()
    assert {"against_teacher/against.json", "against_teacher/against.md"} <= set(read_outputs(run))
    assert "vs " in capsys.readouterr().out
    assert main([*argv[:-1], str(tmp_path / "x"), "--no-ncc"]) == 2
    assert "error: --against with --lm takes no --no-ncc" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()
