"""LM training data: text folders, Hugging Face ``datasets`` sources (save_to_disk directories, JSONL, JSON,
Parquet, Arrow files) written in the test, prompt/completion pairs and chat conversations rendered with a chat
template, the completion-only loss mask checked token by token against the template's rendering, and the pack and
pad layouts."""

import json

import pytest
import torch

from kdcollapse import lm
from kdcollapse.errors import DataError, KdcollapseError

transformers = pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
datasets = pytest.importorskip("datasets", reason="pip install 'kdcollapse[llm]'")
from tiny_lm import TEXT, llama_config, tiny_tokenizer, with_bos, write_corpus  # noqa: E402

# ChatML, as SmolLM2's and Qwen's templates write it (without their default system prompt)
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    tok = tiny_tokenizer()
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = CHATML
    return tok


CHATS = [
    [{"role": "user", "content": "What does a teacher assign?"},
     {"role": "assistant", "content": "Probabilities to every token."}],
    [{"role": "system", "content": "Answer briefly."},
     {"role": "user", "content": "Name a language."},
     {"role": "assistant", "content": "Python."},
     {"role": "user", "content": "And a cat?"},
     {"role": "assistant", "content": "The cat sat on the mat."}],
]


def _chatml_pieces(messages):
    """The ChatML rendering written by hand as (piece, counted) pairs, split where the special tokens are: an
    assistant turn counts from its content through its end-of-turn markup."""
    pieces = []
    for m in messages:
        counted = m["role"] == "assistant"
        pieces += [("<|im_start|>", False), (f"{m['role']}\n", False), (m["content"], counted),
                   ("<|im_end|>", counted), ("\n", counted)]
    return pieces


@pytest.mark.parametrize("messages", CHATS)
def test_the_chat_mask_counts_the_assistant_tokens_token_by_token(tokenizer, messages):
    example = lm.Example("c", "chat", messages=tuple(messages))
    ids, mask = lm.tokenize_example(tokenizer, example)
    pieces = _chatml_pieces(messages)
    text, spans = lm.render_chat(tokenizer, messages)
    assert text == "".join(p for p, _ in pieces)
    # the reference: each piece tokenized on its own (the special tokens cut the text where the pieces meet)
    reference_ids, reference_mask = [], []
    for piece, counted in pieces:
        piece_ids = tokenizer(piece, add_special_tokens=False)["input_ids"]
        reference_ids += piece_ids
        reference_mask += [counted] * len(piece_ids)
    assert ids == reference_ids
    assert mask == reference_mask
    counted = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert counted == "".join(f"{m['content']}<|im_end|>\n" for m in messages if m["role"] == "assistant")
    assert [text[a:b] for a, b in spans] == [f"{m['content']}<|im_end|>\n" for m in messages
                                            if m["role"] == "assistant"]
    all_ids, all_mask = lm.tokenize_example(tokenizer, example, loss_on="all")
    assert all_ids == ids and all(all_mask)


def test_prompt_completion_pairs_count_the_completion_only(tokenizer):
    pair = lm.Example("p", "prompt_completion", prompt="The cat sat", completion=" on the mat.")
    ids, mask = lm.tokenize_example(tokenizer, pair)
    prompt = tokenizer("The cat sat", add_special_tokens=False)["input_ids"]
    completion = tokenizer(" on the mat.", add_special_tokens=False)["input_ids"]
    assert ids == prompt + completion + [tokenizer.eos_token_id]
    assert mask == [False] * len(prompt) + [True] * (len(completion) + 1)
    # conversational: prompt and completion are message lists; an assistant turn inside the prompt is not counted
    chat = CHATS[1]
    pair = lm.Example("q", "prompt_completion", prompt=tuple(chat[:-1]), completion=tuple(chat[-1:]))
    ids, mask = lm.tokenize_example(tokenizer, pair)
    full_ids, full_mask = lm.tokenize_example(tokenizer, lm.Example("c", "chat", messages=tuple(chat)))
    assert ids == full_ids
    assert tokenizer.decode([t for t, m in zip(ids, mask) if m]) == "The cat sat on the mat.<|im_end|>\n"
    assert sum(mask) < sum(full_mask)  # "Python." is counted in the chat, not in the pair


def _rows(kind):
    if kind == "text":
        return [{"text": t} for t in TEXT]
    if kind == "prompt_completion":
        return [{"prompt": t.split(" ", 3)[0] + " ", "completion": t.split(" ", 1)[1]} for t in TEXT]
    return [{"messages": CHATS[i % 2]} for i in range(6)]


def _write(rows, fmt, root):
    ds = datasets.Dataset.from_list(rows)
    if fmt == "jsonl":
        path = root / "data.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif fmt == "json":
        path = root / "data.json"
        path.write_text(json.dumps(rows))
    elif fmt == "parquet":
        path = root / "data.parquet"
        ds.to_parquet(str(path))
    elif fmt == "arrow":
        import pyarrow as pa
        path = root / "data.arrow"
        table = ds.data.table
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
    elif fmt == "save_to_disk":
        path = root / "saved"
        ds.save_to_disk(str(path))
    elif fmt == "dataset_dict":
        path = root / "saved_dict"
        half = len(rows) // 2
        datasets.DatasetDict({"train": datasets.Dataset.from_list(rows[:half]),
                              "test": datasets.Dataset.from_list(rows[half:])}).save_to_disk(str(path))
    elif fmt == "folder of jsonl":
        path = root / "shards"
        path.mkdir()
        for i in range(0, len(rows), 3):
            (path / f"part{i:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows[i:i + 3]))
    return path


FORMATS = ["jsonl", "json", "parquet", "arrow", "save_to_disk", "dataset_dict", "folder of jsonl"]


@pytest.mark.parametrize("kind", ["text", "prompt_completion", "chat"])
@pytest.mark.parametrize("fmt", FORMATS)
def test_every_dataset_format_reads_the_same_examples(tmp_path, fmt, kind):
    rows = _rows(kind)
    examples = lm.read_examples(_write(rows, fmt, tmp_path))
    assert [e.kind for e in examples] == [kind] * len(rows)
    if kind == "text":
        assert [e.text for e in examples] == [r["text"] for r in rows]
    elif kind == "prompt_completion":
        assert [(e.prompt, e.completion) for e in examples] == [(r["prompt"], r["completion"]) for r in rows]
    else:
        assert [list(e.messages) for e in examples] == [r["messages"] for r in rows]
    (tmp_path / "ref").mkdir()
    reference = lm.read_examples(_write(rows, "jsonl", tmp_path / "ref"))
    assert [e.name for e in examples] == [e.name for e in reference]  # the split is by content, format-free


def test_a_text_folder_packed_is_todays_corpus(tmp_path, tokenizer):
    root = write_corpus(tmp_path / "corpus", copies=8)
    blocks = lm.example_blocks(tokenizer, lm.read_examples(root), 16, loss_on="completion")
    corpus = lm.tokenize_corpus(tokenizer, root, cache_dir=tmp_path / "cache")
    for split, b in blocks.items():
        assert torch.equal(b.ids, corpus[split].blocks(16)), split
        assert b.targets.all()


@pytest.fixture(scope="module")
def bos_tokenizer():
    """The tiny tokenizer putting <bos> before a text (Gemma's, Llama's way), with a ChatML template whose
    rendering starts with <bos> too (as Gemma's and Llama 3's templates write it)."""
    tok, bos = with_bos(tiny_tokenizer())
    tok.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    tok.chat_template = "{{ bos_token }}" + CHATML
    return tok, bos


def _reference_rows(stream, mask, block_size, prefix):
    """The slow reference of cut_blocks: walk the stream, a row at a time."""
    rows, at, p = [], 0, len(prefix)
    while True:
        head = [] if stream[at:at + p] == prefix else prefix
        take = block_size - len(head)
        if at + take > len(stream):
            return rows
        rows.append((head + stream[at:at + take], [False] * len(head) + mask[at:at + take]))
        at += take


def test_rows_start_with_the_leading_special_tokens_once():
    # by hand: a row already starting with the prefix (7) takes 4 tokens, the others get it added, not counted
    stream = torch.tensor([7, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])
    ids, targets = lm.cut_blocks(stream, torch.ones(12, dtype=torch.bool), 4, [7])
    assert ids.tolist() == [[7, 1, 2, 3], [7, 4, 5, 6], [7, 8, 9, 10]]
    assert targets.tolist() == [[True] * 4, [False, True, True, True], [True] * 4]
    g = torch.Generator().manual_seed(0)
    for block_size, prefix in ((2, [3]), (5, [3]), (6, [3, 4]), (7, [])):
        stream = torch.randint(0, 6, (200,), generator=g)
        mask = torch.rand(200, generator=g) < 0.7
        ids, targets = lm.cut_blocks(stream, mask, block_size, prefix)
        reference = _reference_rows(stream.tolist(), mask.tolist(), block_size, prefix)
        assert ids.tolist() == [r for r, _ in reference] and targets.tolist() == [c for _, c in reference]
        assert ids.dtype == torch.int64 and targets.dtype == torch.bool
    assert torch.equal(lm.cut_blocks(stream, mask, 7)[0], stream[:196].view(28, 7))  # no prefix: the stream's view
    with pytest.raises(KdcollapseError, match="block_size 2 leaves no room after the tokenizer's 2 leading"):
        lm.cut_blocks(stream, mask, 2, [3, 4])


def test_a_beginning_of_text_token_starts_every_row_uncounted(tmp_path, bos_tokenizer):
    """A tokenizer that puts <bos> before a text: every row of every layout and source starts with one <bos>
    (added and not counted, or the chat template's own), the rest of the row as without it."""
    tok, bos = bos_tokenizer
    assert lm.leading_specials(tok) == [bos] and lm.leading_specials(tiny_tokenizer()) == []
    root = write_corpus(tmp_path / "corpus", copies=8)
    corpus = lm.tokenize_corpus(tok, root, cache_dir=tmp_path / "cache")
    assert (corpus["train"].tokens != bos).all()  # the cache holds the text's tokens only, as before
    blocks, _ = lm.data_blocks(tok, lm.DataSpec(source=str(root)), 16, cache_dir=tmp_path / "cache")
    packed = lm.example_blocks(tok, lm.read_examples(root), 16)
    for split, b in blocks.items():
        stream = corpus[split].tokens.long()
        n = len(b)
        assert n == len(stream) // 15 and (b.ids[:, 0] == bos).all() and not b.targets[:, 0].any()
        assert torch.equal(b.ids[:, 1:], stream[:15 * n].view(n, 15)) and b.targets[:, 1:].all()
        assert torch.equal(b.ids, corpus[split].blocks(16, [bos])) and torch.equal(b.ids, packed[split].ids)
        assert torch.equal(b.targets, packed[split].targets)
    pairs = [lm.Example(f"p{i}", "prompt_completion", prompt=f"Q{i}: ", completion=TEXT[i % 8])
             for i in range(40)]
    padded = lm.example_blocks(tok, pairs, 12, layout="pad")
    assert set(padded) == set(lm.SPLITS)
    for split, b in padded.items():  # a row: <bos> and the pair's first 11 tokens, kept when one of them counts
        chosen = [lm.tokenize_example(tok, e) for e in pairs if e.split == split]
        chosen = [(ids, mask) for ids, mask in chosen if any(mask[:11])]
        assert len(b) == b.examples == len(chosen) and b.truncated == len(chosen)  # every pair is longer than 11
        for row, (ids, mask) in enumerate(chosen):
            assert b.ids[row].tolist() == [bos] + ids[:11] and b.targets[row].tolist() == [False] + mask[:11]
    chats = [lm.Example(f"c{i}", "chat", messages=tuple(CHATS[i % 2])) for i in range(8)]
    rendered = [lm.tokenize_example(tok, e) for e in chats]
    assert all(ids[0] == bos and ids[1] != bos for ids, _ in rendered)  # the template writes its <bos>
    longest = max(len(ids) for ids, _ in rendered)
    rows = lm.pad_examples(rendered, longest, tok.pad_token_id, [bos])
    assert rows.truncated == 0 and torch.equal(rows.ids, lm.pad_examples(rendered, longest, tok.pad_token_id).ids)
    chat_packed = lm.pack_examples(rendered, 8, [bos])
    assert (chat_packed.ids[:, 0] == bos).all() and not (chat_packed.ids[:, 1] == bos).any()  # one <bos>, never two


def test_pack_and_pad_layouts(tokenizer):
    examples = [lm.Example(f"doc{i}", "chat", messages=tuple(CHATS[i % 2])) for i in range(4)]
    tokenized = [lm.tokenize_example(tokenizer, e) for e in examples]
    stream = [t for ids, _ in tokenized for t in ids]
    stream_mask = [m for _, mask in tokenized for m in mask]
    packed = lm.pack_examples(tokenized, 8)
    n = len(stream) // 8
    assert packed.ids.shape == (n, 8) and packed.examples == 4
    assert packed.ids.flatten().tolist() == stream[:8 * n]
    assert packed.targets.flatten().tolist() == stream_mask[:8 * n]
    assert torch.equal(packed.loss_mask, packed.targets[:, 1:])
    longest = max(len(ids) for ids, _ in tokenized)
    padded = lm.pad_examples(tokenized, longest - 3, pad_id=tokenizer.pad_token_id)
    assert padded.truncated == sum(len(ids) > longest - 3 for ids, _ in tokenized)
    for row, (ids, mask) in enumerate(tokenized):
        length = min(len(ids), longest - 3)
        assert padded.ids[row, :length].tolist() == ids[:length]
        assert padded.targets[row, :length].tolist() == mask[:length]
        assert not padded.targets[row, length:].any()
        assert (padded.ids[row, length:] == tokenizer.pad_token_id).all()


def test_right_padding_leaves_a_causal_models_logits_unchanged(tokenizer):
    model = lm.load_language_model(llama_config(len(tokenizer)), tokenizer=tokenizer, seed=0).model
    ids, mask = lm.tokenize_example(tokenizer, lm.Example("c", "chat", messages=tuple(CHATS[0])))
    padded = lm.pad_examples([(ids, mask)], len(ids) + 7, pad_id=tokenizer.pad_token_id)
    with torch.no_grad():
        alone = model(torch.tensor([ids])).logits
        in_row = model(padded.ids).logits[:, :len(ids)]
    torch.testing.assert_close(in_row, alone, rtol=1e-5, atol=1e-5)


def test_splits_are_by_content(tmp_path, tokenizer):
    rows = [{"prompt": f"Question {i}: ", "completion": f"answer {i}."} for i in range(60)]
    first = {e.name: e.split for e in lm.read_examples(_write(rows, "jsonl", tmp_path))}
    assert set(first.values()) == set(lm.SPLITS)
    (tmp_path / "more").mkdir()
    again = lm.read_examples(_write(rows[::-1] + [{"prompt": "New ", "completion": "row."}], "jsonl",
                                    tmp_path / "more"))
    assert all(first[e.name] == e.split for e in again if e.name in first)  # reordering and adding move nothing
    blocks = lm.example_blocks(tokenizer, lm.read_examples(tmp_path / "data.jsonl"), 12, layout="pad")
    assert sum(b.examples for b in blocks.values()) == 60
    assert blocks["train"].examples == sum(s == "train" for s in first.values())


def test_bad_data_is_one_error(tmp_path, tokenizer):
    with pytest.raises(KdcollapseError, match="unknown data format 'parquet'.*auto"):
        lm.read_examples(tmp_path, format="parquet")
    with pytest.raises(DataError, match="does not exist"):
        lm.read_examples(tmp_path / "missing")
    path = _write([{"question": "q", "answer": "a"}], "jsonl", tmp_path)
    with pytest.raises(DataError, match="columns \\['answer', 'question'\\].*data.fields"):
        lm.read_examples(path)
    assert lm.read_examples(path, fields=lm.DataFields(prompt="question", completion="answer"))[0].prompt == "q"
    with pytest.raises(DataError, match="format chat needs the column"):
        lm.read_examples(path, format="chat")
    (tmp_path / "mixed").mkdir()
    _write([{"text": "a"}], "jsonl", tmp_path / "mixed")
    _write([{"text": "a"}], "parquet", tmp_path / "mixed")
    with pytest.raises(DataError, match="mixes data files"):
        lm.read_examples(tmp_path / "mixed")
    (tmp_path / "bad").mkdir()
    bad = _write([{"messages": [{"role": "user", "text": "no content"}]}], "jsonl", tmp_path / "bad")
    with pytest.raises(DataError, match="list of .*messages"):
        lm.read_examples(bad)
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"text": "a"}\n{not json\n')
    with pytest.raises(DataError, match="cannot read the dataset"):
        lm.read_examples(broken)
    plain = tiny_tokenizer()
    with pytest.raises(KdcollapseError, match="no chat template"):
        lm.tokenize_example(plain, lm.Example("c", "chat", messages=tuple(CHATS[0])))
    unstable = tiny_tokenizer()
    unstable.add_special_tokens({"additional_special_tokens": ["<|im_start|>", "<|im_end|>"]})
    unstable.chat_template = CHATML + "{{ messages | length }}"  # the count changes every prefix
    with pytest.raises(KdcollapseError, match="prefix"):
        lm.tokenize_example(unstable, lm.Example("c", "chat", messages=tuple(CHATS[0])))
    with pytest.raises(KdcollapseError, match="unknown layout 'stack'"):
        lm.example_blocks(tokenizer, lm.read_examples(path, fields=lm.DataFields(prompt="question",
                                                                                 completion="answer")), 8,
                          layout="stack")


def test_a_dataset_source_without_datasets_names_the_extra(tmp_path, monkeypatch):
    import sys
    path = _write([{"text": "a b c"}], "jsonl", tmp_path)
    monkeypatch.setitem(sys.modules, "datasets", None)
    with pytest.raises(KdcollapseError, match=r"needs datasets.*kdcollapse\[llm\]"):
        lm.read_examples(path)


def test_the_data_section_is_checked_and_gives_blocks_per_split(tmp_path, tokenizer):
    from kdcollapse.errors import ConfigError
    for key, value, message in (("format", "csv", "data.format must be one of auto, text"),
                                ("loss_on", "prompt", "data.loss_on must be one of completion, all"),
                                ("layout", "stack", "data.layout must be one of pack, pad"),
                                ("fields", {"answer": "a"}, "data.fields maps")):
        with pytest.raises(ConfigError, match=message):
            lm.DataSpec(**{key: value})
    root = write_corpus(tmp_path / "corpus", copies=8)
    spec = lm.DataSpec(source=str(root))
    assert spec.text_corpus
    blocks, key = lm.data_blocks(tokenizer, spec, 16, cache_dir=tmp_path / "cache")
    assert key == lm.tokenize_corpus(tokenizer, root, cache_dir=tmp_path / "cache").key
    assert all(b.targets.all() for b in blocks.values())
    rows = [{"messages": CHATS[i % 2]} for i in range(40)] + [{"messages": CHATS[0][:1] + [
        {"role": "assistant", "content": f"Reply number {i}."}]} for i in range(40)]
    path = _write(rows, "jsonl", tmp_path)
    chat = lm.DataSpec(source=str(path), layout="pad")
    assert not chat.text_corpus
    blocks, key = lm.data_blocks(tokenizer, chat, 48)
    again, key_again = lm.data_blocks(tokenizer, chat, 48)
    assert key == key_again and len(key) == 64
    _, long_mask = lm.tokenize_example(tokenizer, lm.Example("c", "chat", messages=tuple(CHATS[1])))
    assert long_mask.index(True) >= 48  # so a padded row of 48 tokens of CHATS[1] counts nothing: its rows are dropped
    assert sum(b.examples for b in blocks.values()) == 60
    train = blocks["train"]
    assert train.ids.shape[1] == 48 and train.targets.any(1).all() and not train.targets.all()
    everything, other_key = lm.data_blocks(tokenizer, lm.DataSpec(source=str(path), layout="pad", loss_on="all"), 48)
    assert other_key != key and (everything["train"].targets.sum() > train.targets.sum())
