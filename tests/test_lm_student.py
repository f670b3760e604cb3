"""Students built from the teacher: a student keeping every layer gives the teacher's logits exactly; a pruned one
equals the teacher with those layers deleted from a deep copy (the slow reference); DistilBERT's layer choice is
its extraction script's; Minitron's block score equals a reference from the model's own hidden states and drops a
block that does nothing."""

import copy

import pytest
import torch
from torch import nn

from kdcollapse import lm
from kdcollapse.errors import ConfigError, KdcollapseError

transformers = pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
from tiny_lm import TEXT, gpt2_config, llama_config, tiny_tokenizer  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


def _teacher(tokenizer, kind, layers=6):
    config = (llama_config(len(tokenizer), layers=layers) if kind == "llama"
              else gpt2_config(len(tokenizer), layers=layers) if kind == "gpt2"
              else {**llama_config(len(tokenizer), layers=layers), "model_type": "qwen2",
                    "use_sliding_window": True, "sliding_window": 4, "max_window_layers": 3})
    return lm.load_language_model(config, tokenizer=tokenizer, seed=1).model


def _ids(tokenizer):
    rows = [tokenizer.encode(TEXT[0] + " " + TEXT[1]), tokenizer.encode(TEXT[2] + " " + TEXT[5])]
    length = min(map(len, rows))
    return torch.tensor([row[:length] for row in rows])


@torch.no_grad()
def _logits(model, ids):
    return model(ids, use_cache=False).logits


def _deleted(teacher, keep):
    """The slow reference: a deep copy of the teacher with the other decoder layers deleted from its module list."""
    model = copy.deepcopy(teacher)
    base = model.transformer if hasattr(model, "transformer") else model.model
    name = "h" if hasattr(model, "transformer") else "layers"
    for index in sorted(set(range(len(getattr(base, name)))) - set(keep), reverse=True):
        del getattr(base, name)[index]
    for j, layer in enumerate(getattr(base, name)):
        attention = getattr(layer, "self_attn", None) or getattr(layer, "attn")
        attention.layer_idx = j
    model.config.num_hidden_layers = len(keep)
    if isinstance(getattr(model.config, "layer_types", None), list):
        model.config.layer_types = [teacher.config.layer_types[i] for i in keep]
    return model


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2"])
def test_a_student_keeping_every_layer_is_the_teacher(tokenizer, kind):
    teacher = _teacher(tokenizer, kind)
    student = lm.student_from_teacher(teacher, range(6))
    ids = _ids(tokenizer)
    torch.testing.assert_close(_logits(student, ids), _logits(teacher, ids), rtol=0, atol=0)
    assert student is not teacher and not student.training


@pytest.mark.parametrize("kind", ["llama", "gpt2", "qwen2"])
@pytest.mark.parametrize("keep", [[0, 2, 4], [1, 2, 3, 5], [5]])
def test_a_pruned_student_is_the_teacher_with_those_layers_deleted(tokenizer, kind, keep):
    teacher = _teacher(tokenizer, kind)
    before = {k: v.clone() for k, v in teacher.state_dict().items()}
    student = lm.student_from_teacher(teacher, keep)
    ids = _ids(tokenizer)
    torch.testing.assert_close(_logits(student, ids), _logits(_deleted(teacher, keep), ids), rtol=0, atol=0)
    assert student.config.num_hidden_layers == len(keep)
    assert all(torch.equal(v, before[k]) for k, v in teacher.state_dict().items())  # the teacher is untouched
    # the copies are the student's own: training it leaves the teacher as it was
    student.get_input_embeddings().weight.data.add_(1.0)
    assert torch.equal(teacher.get_input_embeddings().weight, before[next(k for k in before if "wte" in k or
                                                                           "embed_tokens" in k)])
    assert sum(p.numel() for p in student.parameters()) < sum(p.numel() for p in teacher.parameters())


def test_a_float64_student_holds_the_teachers_kept_weights_bit_for_bit(tokenizer):
    teacher = lm.load_language_model(llama_config(len(tokenizer), layers=4), tokenizer=tokenizer, seed=1,
                                     dtype=torch.float64).model
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights float32 cannot hold, so a trip through float32 would round every one
        for p in teacher.parameters():
            p.add_(torch.randn(p.shape, generator=g, dtype=torch.float64) * 1e-3)
    assert all((p.float().double() != p).any() for p in teacher.parameters())
    student = lm.student_from_teacher(teacher, [1, 3])
    theirs, ours = teacher.state_dict(), student.state_dict()
    assert all(v.dtype == torch.float64 for v in ours.values() if v.is_floating_point())
    renamed = {"model.layers.0.": "model.layers.1.", "model.layers.1.": "model.layers.3."}
    for key, value in ours.items():
        head = ".".join(key.split(".")[:3]) + "."
        assert torch.equal(value, theirs[renamed[head] + key[len(head):] if head in renamed else key]), key


def test_distilbert_layers_are_its_extraction_scripts():
    # huggingface/transformers, examples/research_projects/distillation/scripts/extract_distilbert.py
    # (BERT-base 12 layers -> DistilBERT 6): `for teacher_idx in [0, 2, 4, 7, 9, 11]:`
    assert lm.distilbert_layers(12, 6) == [0, 2, 4, 7, 9, 11]
    assert lm.distilbert_layers(12) == [0, 2, 4, 7, 9, 11]  # keep defaults to one layer out of two
    assert lm.distilbert_layers(30) == [round(i * 29 / 14 + 1e-9) for i in range(15)]
    for n in range(1, 41):
        for keep in range(1, n + 1):
            chosen = lm.distilbert_layers(n, keep)
            assert len(chosen) == keep and chosen == sorted(set(chosen)) and chosen[0] == 0
            assert keep == 1 or chosen[-1] == n - 1
    assert lm.distilbert_layers(7, 7) == list(range(7))
    with pytest.raises(KdcollapseError, match="keep must be in \\[1, 12\\]"):
        lm.distilbert_layers(12, 13)


def _reference_block_importance(model, ids, size):
    """1 - mean cos between the residual stream entering layer s and leaving layer s + size - 1, read from
    ``output_hidden_states`` of a copy whose final norm is the identity (so the last entry is pre-norm)."""
    model = copy.deepcopy(model)
    model.model.norm = nn.Identity()
    with torch.no_grad():
        states = model(ids, output_hidden_states=True, use_cache=False).hidden_states
    n = len(states) - 1
    return torch.tensor([1 - torch.nn.functional.cosine_similarity(states[s].double(), states[s + size].double(),
                                                                   dim=-1).mean().item()
                         for s in range(n - size + 1)], dtype=torch.float64)


@pytest.mark.parametrize("size", [1, 2, 5])
def test_block_importance_equals_the_hidden_states_reference(tokenizer, size):
    teacher = _teacher(tokenizer, "llama")
    ids = _ids(tokenizer)
    torch.testing.assert_close(lm.block_importance(teacher, ids, size, batch_size=1),
                               _reference_block_importance(teacher, ids, size), rtol=1e-9, atol=1e-12)


def test_minitron_drops_the_block_that_does_nothing(tokenizer):
    teacher = _teacher(tokenizer, "llama")
    with torch.no_grad():  # layers 2 and 3 add nothing to the residual stream: their block scores 0
        for index in (2, 3):
            teacher.model.layers[index].self_attn.o_proj.weight.zero_()
            teacher.model.layers[index].mlp.down_proj.weight.zero_()
    ids = _ids(tokenizer)
    scores = lm.block_importance(teacher, ids, 2)
    assert scores[2] == pytest.approx(0, abs=1e-12) and (scores[[0, 1, 3, 4]] > 1e-4).all()
    assert lm.minitron_layers(teacher, ids, keep=4) == [0, 1, 4, 5]
    init = lm.StudentInit.from_mapping({"from": "teacher", "layers": "minitron", "keep": 4})
    keep = lm.select_layers(teacher, init, ids)
    student = lm.student_from_teacher(teacher, keep)
    torch.testing.assert_close(_logits(student, ids), _logits(teacher, ids), rtol=1e-5, atol=1e-5)  # nothing lost
    with pytest.raises(KdcollapseError, match="calibration tokens"):
        lm.select_layers(teacher, init)


def test_student_init_is_checked_before_anything_loads():
    assert lm.StudentInit.from_mapping({"from": "teacher"}) == lm.StudentInit("distilbert", None, 32)
    assert lm.StudentInit.from_mapping({"from": "teacher", "layers": [0, 3]}).layers == (0, 3)
    bad = [({"layers": "distilbert"}, "from must be 'teacher'"),
           ({"from": "teacher", "layers": "shortgpt"}, "one of distilbert, minitron, all or a list"),
           ({"from": "teacher", "layers": [3, 1]}, "strictly increasing"),
           ({"from": "teacher", "layers": [0, 1], "keep": 2}, "keep goes with"),
           ({"from": "teacher", "keep": 0}, "keep must be an int >= 1"),
           ({"from": "teacher", "calibration_blocks": 0}, "calibration_blocks must be"),
           ({"from": "teacher", "layer": [0]}, "unknown keys in student.init: layer")]
    for spec, message in bad:
        with pytest.raises(ConfigError, match=message):
            lm.StudentInit.from_mapping(spec)
    teacher = _teacher(tiny_tokenizer(), "llama", layers=3)
    with pytest.raises(KdcollapseError, match="the teacher has 3 layers"):
        lm.select_layers(teacher, lm.StudentInit.from_mapping({"from": "teacher", "layers": [0, 5]}))


def test_the_student_section_is_a_config_or_an_init_from_the_teacher(capfd):
    assert lm.check_student_section({"model_type": "llama", "hidden_size": 64, "num_attention_heads": 2}) is None
    assert "eos_token_id" not in capfd.readouterr().err  # no warning about a stand-in vocabulary
    assert lm.check_student_section({"init": {"from": "teacher", "layers": "minitron", "keep": 3}}) == \
        lm.StudentInit("minitron", 3, 32)
    with pytest.raises(ConfigError, match="remove student.hidden_size"):
        lm.check_student_section({"init": {"from": "teacher"}, "hidden_size": 64})
    with pytest.raises(ConfigError, match="student: unknown keys for a llama config: hiden_size"):
        lm.check_student_section({"model_type": "llama", "hiden_size": 64})
