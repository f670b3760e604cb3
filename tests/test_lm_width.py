"""Width pruning (Minitron's activation importance): removing neurons and heads equals the teacher with those units'
activations zeroed; removing embedding channels equals the teacher with those channels zeroed and every RMSNorm
rescaled (the slow references); the importance equals a reference from the activations; keeping every unit is the
teacher; the student.init.width option is checked and trains in distill-lm; on real text (heavy, SmolLM2-135M) a
pruned student starts at a far lower perplexity than a random student of the same shape."""

import copy
import math

import pytest
import torch

from kdcollapse import lm
from kdcollapse.errors import ConfigError, KdcollapseError

transformers = pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
from tiny_lm import TEXT, llama_config, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _teacher(tokenizer, kind="llama"):
    config = llama_config(len(tokenizer), hidden=32, layers=2, num_attention_heads=4, num_key_value_heads=2,
                          intermediate_size=48, rms_norm_eps=0.1)  # a large epsilon: a wrong scale of it shows
    if kind == "qwen2":  # q/k/v biases
        config = {**config, "model_type": "qwen2"}
    model = lm.load_language_model(config, tokenizer=tokenizer, seed=1).model.double()
    with torch.no_grad():  # non-trivial norms, so that a wrong channel or scale shows
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.rand_like(p) + 0.5)
    return model


def _ids(tokenizer):
    rows = [tokenizer.encode(t) for t in (TEXT[0] + " " + TEXT[1], TEXT[2] + " " + TEXT[5], TEXT[3] + " " + TEXT[4])]
    length = min(map(len, rows))
    return torch.tensor([row[:length] for row in rows])


@torch.no_grad()
def _logits(model, ids):
    return model(ids, use_cache=False).logits


def _masked(teacher, keep):
    """The slow reference: a copy of the teacher with the removed neurons' and heads' output columns zeroed and the
    removed channels zeroed everywhere they enter the residual stream, every RMSNorm's weight times sqrt(H'/H) and
    its epsilon times H'/H."""
    model = copy.deepcopy(teacher)
    config, H = model.config, model.config.hidden_size
    dim = config.hidden_size // config.num_attention_heads
    gone = torch.ones(H, dtype=torch.bool)
    gone[keep["channels"]] = False
    share = len(keep["channels"]) / H
    with torch.no_grad():
        model.model.embed_tokens.weight[:, gone] = 0
        for i, layer in enumerate(model.model.layers):
            neurons = torch.ones(config.intermediate_size, dtype=torch.bool)
            neurons[keep["neurons"][i]] = False
            layer.mlp.down_proj.weight[:, neurons] = 0
            layer.mlp.down_proj.weight[gone] = 0
            heads = torch.ones(config.num_attention_heads, dtype=torch.bool)
            heads[keep["heads"][i]] = False
            layer.self_attn.o_proj.weight[:, heads.repeat_interleave(dim)] = 0
            layer.self_attn.o_proj.weight[gone] = 0
        for module in model.modules():
            if type(module).__name__.endswith("RMSNorm"):
                module.weight.mul_(math.sqrt(share))
                module.variance_epsilon *= share
    return model


@pytest.mark.parametrize("kind", ["llama", "qwen2"])
@pytest.mark.parametrize("width", [{"intermediate_size": 20}, {"num_attention_heads": 2},
                                   {"hidden_size": 20}, {"hidden_size": 24, "intermediate_size": 30,
                                                         "num_attention_heads": 2}])
def test_a_width_pruned_student_is_the_teacher_with_those_units_masked(tokenizer, kind, width):
    teacher = _teacher(tokenizer, kind)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    ids = _ids(tokenizer)
    student, keep = lm.prune_width(teacher, width, ids)
    # transformers' RMSNorm computes in float32 even on float64 inputs: where channels go, float32 rounding
    torch.testing.assert_close(_logits(student, ids), _logits(_masked(teacher, keep), ids), rtol=0,
                               atol=1e-6 if "hidden_size" in width else 1e-10)
    config = student.config
    assert (config.hidden_size, config.intermediate_size, config.num_attention_heads) == tuple(
        width.get(k, getattr(teacher.config, k)) for k in ("hidden_size", "intermediate_size", "num_attention_heads"))
    assert config.num_key_value_heads == 2 and sum(p.numel() for p in student.parameters()) < \
        sum(p.numel() for p in teacher.parameters())
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())  # the teacher is untouched
    # two heads of four with two key-value groups: one per group
    assert all(((h // 2) == torch.arange(len(h)) * 2 // len(h)).all() for h in keep["heads"])


def test_keeping_every_unit_is_the_teacher(tokenizer):
    teacher = _teacher(tokenizer)
    ids = _ids(tokenizer)
    student, _ = lm.prune_width(teacher, {}, ids)
    torch.testing.assert_close(_logits(student, ids), _logits(teacher, ids), rtol=0, atol=0)


def test_importance_equals_the_activation_reference(tokenizer):
    """|activation| averaged over each block's counted tokens, then the L2 norm over the blocks, from activations
    the reference records itself (forward hooks on the modules' inputs and outputs)."""
    teacher = _teacher(tokenizer)
    ids = _ids(tokenizer)
    mask = torch.ones(ids.shape, dtype=torch.bool)
    mask[0, :3] = False
    mask[2] = False  # a block with no counted token counts for nothing
    got = lm.width_importance(teacher, ids, mask=mask, batch_size=2)
    seen = {}
    hooks = [teacher.model.layers[1].mlp.down_proj.register_forward_pre_hook(lambda m, a: seen.update(mlp=a[0])),
             teacher.model.layers[0].self_attn.o_proj.register_forward_pre_hook(lambda m, a: seen.update(att=a[0])),
             teacher.model.norm.register_forward_hook(lambda m, a, out: seen.update(final=out))]
    norms = []
    hooks += [n.register_forward_hook(lambda m, a, out: norms.append(out)) for layer in teacher.model.layers
              for n in (layer.input_layernorm, layer.post_attention_layernorm)]
    with torch.no_grad():
        teacher(ids, use_cache=False)
    for h in hooks:
        h.remove()

    def aggregate(x):  # (B, T, K)
        rows = [x[b, mask[b]].abs().mean(0) for b in range(len(x)) if mask[b].any()]
        return torch.stack(rows).norm(dim=0)

    torch.testing.assert_close(got["neurons"][1], aggregate(seen["mlp"]))
    torch.testing.assert_close(got["heads"][0], aggregate(seen["att"].unflatten(-1, (4, 8)).norm(dim=-1)))
    channels = sum(aggregate(x) ** 2 for x in [*norms, seen["final"]]).sqrt()
    torch.testing.assert_close(got["channels"], channels)


def test_width_options_are_checked(tokenizer):
    assert lm.StudentInit.from_mapping({"from": "teacher", "width": {"hidden_size": 16}}) == \
        lm.StudentInit("all", None, 32, (("hidden_size", 16),))
    bad = [({"width": {"hiden_size": 16}}, "unknown keys in student.init.width: hiden_size"),
           ({"width": {"hidden_size": 0}}, "width.hidden_size must be an int >= 1"),
           ({"width": []}, "width must be a mapping"),
           ({"width": {"hidden_size": 16}, "keep": 2}, "keep goes with")]
    for spec, message in bad:
        with pytest.raises(ConfigError, match=message):
            lm.StudentInit.from_mapping({"from": "teacher", **spec})
    teacher = _teacher(tokenizer)
    with pytest.raises(KdcollapseError, match="must be in \\[1, 32\\]"):
        lm.check_width(teacher.config, {"hidden_size": 64})
    with pytest.raises(KdcollapseError, match="multiple of the teacher's 2 key-value heads"):
        lm.check_width(teacher.config, {"num_attention_heads": 3})
    gpt2 = lm.load_language_model({"model_type": "gpt2", "vocab_size": len(tokenizer), "n_embd": 16, "n_layer": 1,
                                   "n_head": 2}, tokenizer=tokenizer, seed=0).model
    with pytest.raises(KdcollapseError, match="Llama-style decoder"):
        lm.prune_width(gpt2, {"hidden_size": 8}, _ids(tokenizer))


@pytest.mark.heavy
def test_a_pruned_smollm2_starts_below_a_random_student_of_its_shape():
    """SmolLM2-135M (576 wide, 1536 MLP, 9 heads in 3 groups, 30 layers) pruned to 384 / 1024 / 6 heads on 8 blocks
    of the Python documentation: its perplexity on 8 other blocks is far below a random student's of the same
    shape."""
    pytest.importorskip("gguf")
    try:
        teacher_lm = lm.load_language_model(lm.SMOLLM2)
    except KdcollapseError as err:
        pytest.skip(str(err))
    tokenizer, teacher = teacher_lm.tokenizer, teacher_lm.model
    try:
        corpus = lm.tokenize_corpus(tokenizer)
    except KdcollapseError as err:
        pytest.skip(str(err))
    blocks = corpus.splits["train"].blocks(64)
    calibration, held_out = blocks[:8], blocks[8:16]
    student, _ = lm.prune_width(teacher, {"hidden_size": 384, "intermediate_size": 1024, "num_attention_heads": 6},
                                calibration)
    config = {k: v for k, v in student.config.to_dict().items() if k in (
        "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
        "num_key_value_heads", "head_dim", "tie_word_embeddings", "max_position_embeddings", "rms_norm_eps",
        "rope_theta")}
    random = lm.load_language_model(config, tokenizer=tokenizer, seed=0).model

    @torch.no_grad()
    def perplexity(model):
        logits = model(held_out, use_cache=False).logits[:, :-1]
        return math.exp(torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]),
                                                          held_out[:, 1:].reshape(-1)))

    pruned, fresh, whole = perplexity(student), perplexity(random), perplexity(teacher)
    assert pruned < fresh / 10, (pruned, fresh, whole)
    assert whole < pruned
