"""Next-token classes of causal language models (kdcollapse.analysis analyze_tokens) on tiny random
Llama and GPT-2 configurations: positions and labels as the LLM losses take them, the exclusion rule, and
per-layer statistics equal to the metrics of the hidden states gathered by hand."""

from __future__ import annotations

import json
import math

import pytest
import torch

from kdcollapse.analysis import (analyze_tokens, next_token_targets, plot_token_layers, resolve_layers,
                                 token_classes)
from kdcollapse.errors import KdcollapseError
from kdcollapse.losses import IGNORE_INDEX, shift_for_causal_lm
from kdcollapse.metrics import ncc_accuracy
from kdcollapse.metrics.functional import collapse_metrics_from_features

transformers = pytest.importorskip("transformers")

VOCAB = 11


def tiny_llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64)
    return transformers.LlamaForCausalLM(config).eval()


def tiny_gpt2() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.GPT2Config(vocab_size=VOCAB, n_embd=16, n_layer=2, n_head=2, n_positions=64)
    return transformers.GPT2LMHeadModel(config).eval()


def corpus(seed: int = 0, batches: int = 4, size: int = 6, length: int = 24) -> list[dict[str, torch.Tensor]]:
    """Token batches with right padding (attention_mask 0) and a few ignore_index labels. Token 10 never
    occurs and token 9 is rare, so min_count decides about them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for b in range(batches):
        ids = torch.randint(0, 9, (size, length), generator=g)
        if b == 0:
            ids[0, 5] = 9
        mask = torch.ones(size, length, dtype=torch.int64)
        mask[1, length - 5:] = 0
        labels = ids.masked_fill(mask == 0, IGNORE_INDEX)
        labels[2, 3] = IGNORE_INDEX
        out.append({"input_ids": ids, "attention_mask": mask, "labels": labels})
    return out


def test_positions_and_labels_are_those_of_the_llm_losses():
    batch = corpus()[0]
    labels, keep = next_token_targets(batch)
    shifted = shift_for_causal_lm(torch.zeros(*batch["input_ids"].shape, VOCAB), None, batch["labels"],
                                  batch["attention_mask"])
    assert torch.equal(keep, shifted.mask) and torch.equal(labels, shifted.labels)
    # Without explicit labels the padding is unlabelled.
    unlabelled = {k: v for k, v in batch.items() if k != "labels"}
    _, keep_mask_only = next_token_targets(unlabelled)
    assert torch.equal(keep_mask_only, batch["attention_mask"][:, 1:].bool())


def test_exclusion_rule_counts_and_renumbers():
    batches = corpus()
    classes = token_classes(batches, VOCAB, min_count=2)
    counted = torch.zeros(VOCAB, dtype=torch.int64)
    for batch in batches:
        labels, keep = next_token_targets(batch)
        counted += torch.bincount(labels[keep], minlength=VOCAB)
    assert torch.equal(classes.counts, counted)
    assert classes.kept.tolist() == [t for t in range(VOCAB) if counted[t] >= 2]
    summary = classes.summary()
    assert summary["classes_never_seen"] == 1 and summary["classes_below_min_count"] == 1  # tokens 10 and 9
    assert summary["tokens_excluded"] == 1 and summary["tokens"] == int(counted.sum())
    assert classes.index[classes.kept].tolist() == list(range(classes.num_classes))
    with pytest.raises(KdcollapseError, match="min_count must be a positive integer, got 0"):
        token_classes(batches, VOCAB, min_count=0)
    with pytest.raises(KdcollapseError, match="collapse metrics need 2 classes"):
        token_classes(batches, VOCAB, min_count=10**6)


def gathered(model, batches, classes, layer):
    """Hidden states of the kept positions at ``layer`` and their class indices, collected by hand."""
    features, targets, logits = [], [], []
    with torch.no_grad():
        for batch in batches:
            out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], output_hidden_states=True)
            for i in range(batch["input_ids"].shape[0]):
                for t in range(batch["input_ids"].shape[1] - 1):
                    token = int(batch["labels"][i, t + 1])
                    if token == IGNORE_INDEX or not batch["attention_mask"][i, t + 1] or classes.index[token] < 0:
                        continue
                    features.append(out.hidden_states[layer][i, t])
                    targets.append(int(classes.index[token]))
                    logits.append(out.logits[i, t, classes.kept])
    return torch.stack(features).double(), torch.tensor(targets), torch.stack(logits)


@pytest.mark.parametrize("build", [tiny_llama, tiny_gpt2])
def test_every_layer_in_one_pass_equals_the_metrics_of_gathered_features(build, tmp_path):
    model, batches = build(), corpus()
    result = analyze_tokens(model, batches, layers="all", min_count=2, out_dir=tmp_path)
    classes = token_classes(batches, VOCAB, min_count=2)
    assert sorted(result["layers"]) == [0, 1, 2]
    weight = model.get_output_embeddings().weight.detach()[classes.kept].double()
    for layer in (0, 1, 2):
        h, y, logits = gathered(model, batches, classes, layer)
        expected = collapse_metrics_from_features(h, y, classes.num_classes, weight if layer == 2 else None)
        ours = result["layers"][layer]
        assert ("gnc2" in ours) == (layer == 2)  # the classifier reads the last hidden state only
        for key, value in expected.items():
            assert ours[key] == pytest.approx(float(value), rel=1e-6, abs=1e-9), (layer, key)
        means = torch.stack([h[y == k].mean(0) for k in range(classes.num_classes)])
        nc4 = ncc_accuracy(h, y, means, logits)
        assert ours["ncc_accuracy"] == pytest.approx(float(nc4["ncc_accuracy"]))
        assert ours["ncc_agreement"] == pytest.approx(float(nc4["ncc_agreement"]))
    written = json.loads((tmp_path / "analysis.json").read_text())
    assert written["classes"] == result["classes"] and set(written["layers"]) == {"0", "1", "2"}
    counts = json.loads((tmp_path / "token_counts.json").read_text())
    assert sum(c for _, c in counts["id_count"]) == result["classes"]["tokens"]
    assert (tmp_path / "analysis.md").exists() and (tmp_path / "layers.png").exists()
    # The perplexity: exp of the mean next-token cross-entropy over every labelled position (excluded classes too).
    nll, scored = 0.0, 0
    with torch.no_grad():
        for batch in batches:
            logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
            shifted = shift_for_causal_lm(logits, None, batch["labels"], batch["attention_mask"])
            nll += float(torch.nn.functional.cross_entropy(shifted.student[shifted.mask].double(),
                                                           shifted.labels[shifted.mask], reduction="sum"))
            scored += int(shifted.mask.sum())
    assert result["tokens_scored"] == scored > result["classes"]["tokens"] - result["classes"]["tokens_excluded"]
    assert result["cross_entropy"] == pytest.approx(nll / scored, rel=1e-6)
    assert result["perplexity"] == pytest.approx(math.exp(nll / scored), rel=1e-6)
    # float32 class sums (what "auto" picks for a large model) agree with float64 to the stated 1e-4.
    assert result["accumulate"] == "float64"  # "auto" at this size
    single = analyze_tokens(model, batches, layers="all", accumulate="float32", ncc=False)
    assert single["accumulate"] == "float32"
    for layer, values in single["layers"].items():
        for key, value in values.items():
            assert value == pytest.approx(result["layers"][layer][key], rel=1e-4, abs=1e-7, nan_ok=True), (layer, key)
    # Several models, seeds as bands, layers read back from JSON (str keys): one figure.
    assert plot_token_layers({"a": [result, written], "b": [written]}, tmp_path / "models.png") == "models.png"


@pytest.mark.parametrize("build, dtype, layers", [(tiny_llama, torch.float32, "all"), (tiny_gpt2, torch.bfloat16, [0, 2])])
def test_nc4_from_the_statistics_pass_equals_a_second_pass_bit_for_bit(build, dtype, layers):
    """NC4's features kept from the statistics pass (NccCache) give the very floats of the second model pass the
    budget forces: every metric equal, the model run once per batch instead of twice."""
    model, batches = build().to(dtype), corpus()
    calls = []
    model.register_forward_hook(lambda *_: calls.append(1))
    classes = token_classes(batches, VOCAB, min_count=2)
    chosen = resolve_layers(layers, 3)
    needed = int(classes.counts[classes.kept].sum()) * (len(chosen) * 16 * dtype.itemsize + 16)
    results = {}
    for budget in (needed, needed - 1, 0):
        calls.clear()
        results[budget] = analyze_tokens(model, batches, layers=layers, ncc_cache_bytes=budget)
        cached = budget == needed
        assert len(calls) == len(batches) * (1 if cached else 2), budget
        assert results[budget]["ncc_features"] == {"bytes_needed": needed, "budget_bytes": budget, "features": (
            "cached from the statistics pass" if cached else "a second model pass (over the budget)")}
    assert results[needed]["layers"] == results[needed - 1]["layers"] == results[0]["layers"]  # exact floats
    assert all(0 < v["ncc_accuracy"] < 1 for v in results[needed]["layers"].values())
    assert analyze_tokens(model, batches, layers=layers, ncc=False)["ncc_features"] is None
    with pytest.raises(KdcollapseError, match="NC4 cache budget must be a non-negative number of bytes, got -1"):
        analyze_tokens(model, batches, layers=layers, ncc_cache_bytes=-1)


def test_layer_choice():
    assert resolve_layers(None, 31) == [30] == resolve_layers("last", 31)
    assert resolve_layers("all", 3) == [0, 1, 2]
    assert resolve_layers([-1, 0, 5, 5], 31) == [0, 5, 30]
    with pytest.raises(KdcollapseError, match="layer 31 is not a hidden-state index; valid: 0..30"):
        resolve_layers([31], 31)


def test_analyze_command_on_a_model_directory_and_a_text_folder(tmp_path, monkeypatch, capsys):
    from tiny_lm import llama_config, tiny_tokenizer, write_corpus

    from kdcollapse.cli import main
    from kdcollapse.lm import load_language_model

    monkeypatch.setenv("KDCOLLAPSE_CACHE", str(tmp_path / "cache"))
    tokenizer = tiny_tokenizer()
    model_dir = tmp_path / "model"
    load_language_model(llama_config(len(tokenizer)), tokenizer=tokenizer, seed=0).model.save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    corpus = write_corpus(tmp_path / "text")
    out = tmp_path / "out"
    argv = ["analyze", "--lm", str(model_dir), "--corpus", str(corpus), "--split", "train", "--layers", "0,-1",
            "--block-size", "16", "--min-count", "3", "--gnc-convention", "official", "--out", str(out),
            "--no-progress"]
    assert main(argv) == 0
    result = json.loads((out / "analysis.json").read_text())
    assert set(result["layers"]) == {"0", "2"} and result["gnc_convention"] == "official"
    assert result["classes"]["min_count"] == 3 and "gnc2" in result["layers"]["2"]
    assert "-> " in capsys.readouterr().out
    # --random-init: the directory's architecture, weights drawn afresh; seed 0 redraws the saved model exactly.
    assert main([*argv[:-3], "--random-init", "0", "--out", str(tmp_path / "fresh"), "--no-progress"]) == 0
    fresh = json.loads((tmp_path / "fresh" / "analysis.json").read_text())
    assert fresh["source"] == f"{model_dir} (random initialisation, seed 0)" and result["source"] == str(model_dir)
    assert fresh["layers"] == result["layers"] and fresh["perplexity"] == result["perplexity"]
    # --ncc-cache-gib 0: NC4 runs the model a second time, says so, and gives the same numbers.
    capsys.readouterr()
    assert main([*argv[:-3], "--ncc-cache-gib", "0", "--out", str(tmp_path / "twice"), "--no-progress"]) == 0
    assert "NC4 ran the model a second time" in capsys.readouterr().out
    twice = json.loads((tmp_path / "twice" / "analysis.json").read_text())
    assert twice["layers"] == result["layers"] and result["ncc_features"]["features"].startswith("cached")
    assert main([*argv[:-3], "--ncc-cache-gib", "-1", "--out", str(tmp_path / "bad")]) == 2
    assert "--ncc-cache-gib: must be a finite number >= 0, got '-1'" in capsys.readouterr().err
    assert main(["analyze", "--lm", str(model_dir), "--corpus", str(corpus), "--out", str(out), "--layers", "x"]) == 2
    assert "error: --layers must be comma-separated integers, got 'x'" in capsys.readouterr().err


def test_analyze_lm_into_a_run_directory_is_listed_removed_by_overwrite_and_flagged_stale(tmp_path, monkeypatch):
    from tiny_lm import llama_config, tiny_tokenizer, write_corpus

    from kdcollapse.cli import main
    from kdcollapse.lm import load_language_model
    from kdcollapse.runs import Run, read_outputs
    from kdcollapse.runs._derived import remove_outputs

    monkeypatch.setenv("KDCOLLAPSE_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "run"  # a distill-lm run directory: config.yaml, run.json and its student/
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    (run / "run.json").write_text("{}\n")
    tokenizer = tiny_tokenizer()
    student = run / "student"
    load_language_model(llama_config(len(tokenizer)), tokenizer=tokenizer, seed=0).model.save_pretrained(student)
    tokenizer.save_pretrained(student)
    corpus = write_corpus(tmp_path / "text")
    argv = ["analyze", "--lm", str(student), "--corpus", str(corpus), "--split", "train", "--block-size", "16",
            "--no-ncc", "--no-progress", "--out"]
    assert main([*argv, str(run / "lm_analysis")]) == 0
    assert main([*argv, str(tmp_path / "elsewhere")]) == 0  # outside the run: not its output
    listed = set(read_outputs(run))
    assert {"lm_analysis/analysis.json", "lm_analysis/analysis.md", "lm_analysis/token_counts.json"} <= listed
    assert all(name.startswith("lm_analysis/") for name in listed)
    assert Run(run).stale_outputs() == {}
    load_language_model(llama_config(len(tokenizer)), tokenizer=tokenizer, seed=1).model.save_pretrained(student)
    stale = Run(run).stale_outputs()  # the student was trained further: its analysis no longer describes it
    assert {"lm_analysis/analysis.json", "lm_analysis/analysis.md"} <= set(stale)
    assert "other weights than" in stale["lm_analysis/analysis.json"]
    removed = remove_outputs(run)  # what train/distill-lm --overwrite does first
    assert {p.name for p in removed} >= {"analysis.json", "analysis.md", "token_counts.json"}
    assert not (run / "lm_analysis").exists() and (student / "config.json").is_file()


def _direction_metrics(h: torch.Tensor, y: torch.Tensor, W: torch.Tensor, keep: torch.Tensor) -> dict:
    """The metrics of classifier-row directions by their definitions (docs/metrics.md), over the rows ``keep``:
    mean |cos(w_k, w_k') + 1/(K'−1)| over pairs, 1 − ŵ_k·(mean of the unit features of class k), and the
    variance (Bessel) of cos(w_k, μ_k − μ̄), μ̄ the mean of the class means."""
    K = W.shape[0]
    means = torch.stack([h[y == k].mean(0) for k in range(K)])
    unit_means = torch.stack([torch.nn.functional.normalize(h[y == k], dim=1).mean(0) for k in range(K)])
    centred = means - means.mean(0)
    w = W[keep] / W[keep].norm(dim=1, keepdim=True)
    n = len(w)
    cos = w @ w.T
    off = ~torch.eye(n, dtype=torch.bool)
    return {"nc2_equiangle_w": float((cos[off] + 1 / (n - 1)).abs().mean()),
            "gnc3": float((1 - (w * unit_means[keep]).sum(1)).mean()),
            "unc3_cosine": float(torch.nn.functional.cosine_similarity(W[keep], centred[keep], dim=1).var())}


def test_a_zero_classifier_row_is_left_out_of_the_direction_metrics_only(tmp_path):
    """A fresh Hugging Face model zeroes its padding token's embedding row and a tied head inherits it (what
    ``analyze --lm --random-init`` met on SmolLM2, pad = eos): a real classifier row with no direction. The
    direction metrics are those of the nonzero rows, by their definitions; the magnitude metrics keep the zero
    row; ``classifier_zero_rows`` counts it. The reference formulas are first checked on a model without one."""
    from kdcollapse.geometry import min_one_vs_rest_distance

    batches = corpus()
    classes = token_classes(batches, VOCAB, min_count=2)
    for pad in (None, 2):
        torch.manual_seed(0)
        config = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                          num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                                          tie_word_embeddings=True, pad_token_id=pad)
        model = transformers.LlamaForCausalLM(config).eval()
        weight = model.get_output_embeddings().weight.detach()[classes.kept].double()
        keep = (weight != 0).any(1)
        assert int((~keep).sum()) == (0 if pad is None else 1)  # the pad row (a kept class here) is zero
        ours = analyze_tokens(model, batches, layers="last", min_count=2, ncc=False)["layers"][2]
        h, y, _ = gathered(model, batches, classes, 2)
        assert ours["classifier_zero_rows"] == (0 if pad is None else 1)
        for key, value in _direction_metrics(h, y, weight, keep).items():
            assert ours[key] == pytest.approx(value, rel=1e-6, abs=1e-9), (pad, key)
        assert ours["gnc2"] == pytest.approx(float(min_one_vs_rest_distance(weight[keep]).value), rel=1e-6)
        norms = weight.norm(dim=1)  # a magnitude metric keeps the zero row: its norm 0 is part of the spread
        assert ours["nc2_equinorm_w"] == pytest.approx(float(norms.std() / norms.mean()), rel=1e-6)
        if pad is not None:
            whole = collapse_metrics_from_features(h, y, classes.num_classes, weight)
            assert {k: float(v) for k, v in whole.items()} == pytest.approx(ours, rel=1e-6, abs=1e-9)
