"""kdcollapse.lm: loading causal LMs (directory, GGUF, config), vocabulary checks, the corpus, its
split by document and its token cache. Tiny random models only; the real SmolLM2 test is marked heavy."""

import hashlib
import json
import shutil
import time

import numpy as np

import pytest
import torch

from kdcollapse import lm
from kdcollapse.errors import DataError, KdcollapseError

transformers = pytest.importorskip("transformers", reason="pip install 'kdcollapse[llm]'")
from tiny_lm import TEXT, gpt2_config, llama_config, tiny_tokenizer, write_corpus  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.mark.parametrize("config", [llama_config, gpt2_config])
def test_a_config_builds_a_seeded_random_model_and_a_directory_reloads_it(tmp_path, tokenizer, config):
    a = lm.load_language_model(config(len(tokenizer)), tokenizer=tokenizer, seed=3)
    b = lm.load_language_model(config(len(tokenizer)), tokenizer=tokenizer, seed=3)
    assert a.vocab_size == len(tokenizer) and not a.model.training
    for (name, p), q in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.equal(p, q), name
    a.model.save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    c = lm.load_language_model(tmp_path)
    ids = torch.tensor([tokenizer.encode(TEXT[0])])
    torch.testing.assert_close(c.model(ids).logits, a.model(ids).logits, rtol=0, atol=0)
    assert c.tokenizer.get_vocab() == tokenizer.get_vocab()
    # pretrained=False: the directory's architecture, weights drawn afresh with the seed (the untrained control)
    fresh = lm.load_language_model(tmp_path, pretrained=False, seed=3)
    other = lm.load_language_model(tmp_path, pretrained=False, seed=4)
    assert fresh.tokenizer.get_vocab() == tokenizer.get_vocab() and not fresh.model.training
    for (name, p), q, r in zip(a.model.named_parameters(), fresh.model.parameters(), other.model.parameters()):
        assert torch.equal(p, q), name
        assert p.numel() == 1 or p.std() == 0 or not torch.equal(p, r), name


def test_bad_sources_are_one_line_errors(tmp_path, tokenizer):
    with pytest.raises(KdcollapseError, match="not found"):
        lm.load_language_model(tmp_path / "missing")
    with pytest.raises(KdcollapseError, match="no config.json"):
        lm.load_language_model(tmp_path)
    (tmp_path / "weights.bin").write_bytes(b"x")
    with pytest.raises(KdcollapseError, match="directory with config.json or a .gguf file"):
        lm.load_language_model(tmp_path / "weights.bin")
    with pytest.raises(KdcollapseError, match="needs model_type"):
        lm.load_language_model({"hidden_size": 8})
    with pytest.raises(KdcollapseError, match="unknown keys for a llama config: hiden_size"):
        lm.load_language_model({"model_type": "llama", "hiden_size": 8})
    with pytest.raises(KdcollapseError, match="unknown model_type .no-such-architecture."):
        lm.load_language_model({"model_type": "no-such-architecture"})


def test_a_truncated_or_foreign_gguf_is_one_error(tmp_path):
    gguf = pytest.importorskip("gguf")
    path = tmp_path / "m.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("w", np.arange(4096, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    lm.check_gguf(path)  # whole: fine
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 100])
    with pytest.raises(KdcollapseError, match="truncated|not a readable GGUF"):
        lm.check_gguf(path)
    with pytest.raises(KdcollapseError, match="truncated|not a readable GGUF"):
        lm.load_language_model(path)
    path.write_bytes(b"not a gguf file at all")
    with pytest.raises(KdcollapseError, match="not a readable GGUF"):
        lm.load_language_model(path)


def test_different_vocabularies_are_refused_naming_both(tokenizer):
    other = tiny_tokenizer(vocab_size=280)
    teacher = lm.load_language_model(llama_config(len(tokenizer)), tokenizer=tokenizer, seed=0)
    student = lm.load_language_model(llama_config(len(other)), tokenizer=other, seed=0)
    with pytest.raises(KdcollapseError, match=rf"teacher .* has {len(tokenizer)} tokens, student .* has "
                                              rf"{len(other)}"):
        lm.check_same_vocabulary(teacher, student)
    padded = lm.load_language_model(llama_config(len(tokenizer) + 12), tokenizer=tokenizer, seed=0)
    lm.check_same_vocabulary(teacher, padded)  # a padded head is fine (the losses slice it)
    short = lm.load_language_model(llama_config(len(tokenizer) - 1), tokenizer=tokenizer, seed=0)
    with pytest.raises(KdcollapseError, match="student's output head has"):
        lm.check_same_vocabulary(teacher, short)


def test_the_split_is_by_document_name_and_follows_the_stated_rule():
    names = [f"library/mod{i}.rst.txt" for i in range(2000)]
    for name in names[:50]:
        bucket = int(hashlib.sha256(name.encode()).hexdigest()[:8], 16) % 20
        assert lm.split_of(name) == {0: "test", 1: "validation"}.get(bucket, "train")
    share = {s: sum(lm.split_of(n) == s for n in names) / len(names) for s in lm.SPLITS}
    assert abs(share["test"] - 0.05) < 0.02 and abs(share["validation"] - 0.05) < 0.02


def test_a_corpus_is_tokenized_once_split_by_document_and_cached(tmp_path, tokenizer):
    root = write_corpus(tmp_path / "text")
    docs = lm.read_documents(root)
    assert len(docs) == 5 * len(TEXT) and "empty.txt" not in {d.name for d in docs}
    corpus = lm.tokenize_corpus(tokenizer, root, cache_dir=tmp_path / "cache")
    eos = tokenizer.eos_token_id
    by_name = {d.name: d for d in docs}
    total = 0
    for split in lm.SPLITS:
        s = corpus[split]
        assert all(lm.split_of(n) == split for n in s.names)
        total += len(s.names)
        for i, name in enumerate(s.names):  # each document, then one end-of-text token
            piece = s.tokens[s.offsets[i]:s.offsets[i + 1]].tolist()
            assert piece == tokenizer.encode(by_name[name].text, add_special_tokens=False) + [eos]
    assert total == len(docs)
    cached = list((tmp_path / "cache").iterdir())
    assert len(cached) == 1
    again = lm.tokenize_corpus(tokenizer, root, cache_dir=tmp_path / "cache")
    assert again.key == corpus.key and torch.equal(again["train"].tokens, corpus["train"].tokens)
    (root / "part0" / "doc0.txt").write_text("changed text\n")  # another corpus: another key
    assert lm.tokenize_corpus(tokenizer, root, cache_dir=tmp_path / "cache").key != corpus.key
    blocks = corpus["train"].blocks(8)
    assert blocks.shape[1] == 8 and torch.equal(blocks.flatten(), corpus["train"].tokens[: blocks.numel()].long())


def test_a_corrupt_cache_is_rebuilt(tmp_path, tokenizer):
    root = write_corpus(tmp_path / "text", copies=1)
    corpus = lm.tokenize_corpus(tokenizer, root, cache_dir=tmp_path)
    (path,) = tmp_path.glob("corpus-*.safetensors")
    path.write_bytes(path.read_bytes()[:50])
    assert torch.equal(lm.tokenize_corpus(tokenizer, root, cache_dir=tmp_path)["train"].tokens,
                       corpus["train"].tokens)


def test_a_corpus_without_text_is_one_error(tmp_path):
    (tmp_path / "a.txt").write_text("   \n")
    with pytest.raises(DataError, match="holds no text"):
        lm.read_documents(tmp_path)
    with pytest.raises(DataError, match="not a directory"):
        lm.read_documents(tmp_path / "a.txt")
    (tmp_path / "b.txt").write_bytes(b"\xff\xfe bad")
    with pytest.raises(DataError, match="not UTF-8"):
        lm.read_documents(tmp_path)


# --- stored teacher tokens ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def teacher_and_blocks(tokenizer, tmp_path_factory):
    root = write_corpus(tmp_path_factory.mktemp("text"), copies=2)
    corpus = lm.tokenize_corpus(tokenizer, root, cache_dir=tmp_path_factory.mktemp("cache"))
    teacher = lm.load_language_model(llama_config(len(tokenizer)), tokenizer=tokenizer, seed=1)
    return teacher.model, corpus["train"].blocks(8)[:10]


def test_stored_tokens_with_k_equal_to_v_are_the_full_distribution_bit_for_bit(tmp_path, teacher_and_blocks):
    model, blocks = teacher_and_blocks
    vocab = model.config.vocab_size
    lm.store_teacher_tokens(model, blocks, tmp_path, k=vocab, batch_size=4, shard_blocks=3)
    assert len(list(tmp_path.glob("shard-*.safetensors"))) == 4
    stored = lm.TeacherTokens.load(tmp_path)
    with torch.no_grad():
        full = torch.cat([torch.log_softmax(model(b).logits.float(), -1) for b in blocks.split(4)])
    dense = stored.rows(torch.arange(len(blocks))).log_probs(slice(None), vocab, 1.0)
    assert torch.equal(dense, full.reshape(-1, vocab))


def test_a_second_builder_of_a_store_waits_for_the_first_and_keeps_its_store(tmp_path, teacher_and_blocks):
    """Two runs of a study that share a store and start together: one builds it, the other waits for it (an
    exclusive lock beside the directory) and then finds it complete, without running the teacher at all."""
    import threading

    model, blocks = teacher_and_blocks
    calls, held = [], threading.Event()

    class Teacher:  # counts forwards; the first waits until released, so the first builder holds the lock
        def get_output_embeddings(self):
            return model.get_output_embeddings()

        def __call__(self, batch):
            calls.append(threading.current_thread().name)
            if len(calls) == 1:
                assert held.wait(60)
            return model(batch)

    store = lambda: lm.store_teacher_tokens(Teacher(), blocks, tmp_path / "store", k=5, batch_size=4,  # noqa: E731
                                            shard_blocks=4)
    first, second = (threading.Thread(target=store, name=n) for n in ("first", "second"))
    first.start()
    while not calls:
        time.sleep(0.001)
    second.start()
    second.join(1.0)
    assert second.is_alive() and calls == ["first"]  # waiting, not computing
    held.set()
    first.join(60), second.join(60)
    assert calls == ["first"] * 3  # 10 blocks in batches of 4: the second builder ran none
    lm.TeacherTokens.load(tmp_path / "store")


def test_stored_top_k_keep_the_largest_and_checksums_catch_damage(tmp_path, teacher_and_blocks):
    model, blocks = teacher_and_blocks
    lm.store_teacher_tokens(model, blocks, tmp_path, k=5, temperature=2.0, shard_blocks=4)
    stored = lm.TeacherTokens.load(tmp_path)
    with torch.no_grad():
        log_p = torch.log_softmax(model(blocks).logits.float() / 2.0, -1)
    top = log_p.topk(5, -1)
    torch.testing.assert_close(stored.log_probs, top.values)
    torch.testing.assert_close(stored.log_rest.exp() + stored.log_probs.exp().sum(-1), torch.ones(blocks.shape))
    rows = stored.rows(torch.tensor([3, 1]), slice(None, -1))
    assert rows.indices.shape == (2 * (blocks.shape[1] - 1), 5) and rows.temperature == 2.0
    assert lm.store_teacher_tokens(model, blocks, tmp_path, k=5, temperature=2.0) == tmp_path  # kept
    with pytest.raises(KdcollapseError, match="other blocks, k, temperature or precision"):
        lm.store_teacher_tokens(model, blocks, tmp_path, k=6, temperature=2.0)
    shard = tmp_path / "shard-00001.safetensors"
    data = bytearray(shard.read_bytes())
    data[-3] ^= 1
    shard.write_bytes(bytes(data))
    with pytest.raises(DataError, match="shard-00001.safetensors is missing or damaged"):
        lm.TeacherTokens.load(tmp_path)
    with pytest.raises(DataError, match="no complete store"):
        lm.TeacherTokens.load(tmp_path / "nothing")


def test_a_bf16_store_is_the_teacher_body_in_bf16_and_its_head_in_float32(tmp_path, teacher_and_blocks):
    """precision="bf16": each position's distribution is softmax(W h) with h the body's last hidden state under
    bf16 autocast, cast to float32, and W the float32 head: not the float32 teacher, not a bf16 head, and within
    bf16 rounding of the float32 teacher (KL of a few 1e-4 nats here)."""
    model, blocks = teacher_and_blocks
    vocab = model.config.vocab_size
    lm.store_teacher_tokens(model, blocks, tmp_path / "bf16", k=vocab, batch_size=4, precision="bf16")
    stored = lm.TeacherTokens.load(tmp_path / "bf16").rows(torch.arange(len(blocks))).log_probs(slice(None), vocab, 1.0)
    with torch.no_grad():
        head = model.lm_head.weight.detach().clone()  # tied to the input embeddings: float32
        body, bf16_head, exact = [], [], []
        for b in blocks.split(4):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                h = model.model(b).last_hidden_state
                bf16_head.append(model(b).logits.float().log_softmax(-1))
            body.append((h.float() @ head.T).log_softmax(-1))
            exact.append(model(b).logits.float().log_softmax(-1))
    body, bf16_head, exact = (torch.cat(x).reshape(-1, vocab) for x in (body, bf16_head, exact))
    assert torch.equal(stored, body)
    assert not torch.equal(stored, bf16_head) and not torch.equal(stored, exact)
    kl = (exact.exp() * (exact - stored)).sum(-1)
    assert 0 < float(kl.mean()) < 1e-2
    manifest = json.loads((tmp_path / "bf16" / "manifest.json").read_text())
    assert manifest["teacher_precision"] == "bf16"
    with pytest.raises(KdcollapseError, match="other blocks, k, temperature or precision"):
        lm.store_teacher_tokens(model, blocks, tmp_path / "bf16", k=vocab)  # a float32 store is another store
    lm.store_teacher_tokens(model, blocks, tmp_path / "fp32", k=vocab, batch_size=4)
    assert "teacher_precision" not in json.loads((tmp_path / "fp32" / "manifest.json").read_text())
    with pytest.raises(KdcollapseError, match="precision must be one of float32, bf16, got 'fp16'"):
        lm.store_teacher_tokens(model, blocks, tmp_path / "fp16", k=vocab, precision="fp16")
    assert not (tmp_path / "fp16").exists()


def test_a_store_cut_to_a_smaller_k_equals_the_store_written_at_that_k(tmp_path, teacher_and_blocks):
    """TeacherTokens.top(k): the top k of a top-k' store (k < k') are the store written at k, the rest's mass
    to float32 rounding (distill-lm cuts a cached larger store instead of running the teacher again)."""
    model, blocks = teacher_and_blocks
    lm.store_teacher_tokens(model, blocks, tmp_path / "k9", k=9, temperature=2.0)
    lm.store_teacher_tokens(model, blocks, tmp_path / "k3", k=3, temperature=2.0)
    cut, direct = lm.TeacherTokens.load(tmp_path / "k9").top(3), lm.TeacherTokens.load(tmp_path / "k3")
    assert torch.equal(cut.indices, direct.indices) and torch.equal(cut.log_probs, direct.log_probs)
    torch.testing.assert_close(cut.log_rest, direct.log_rest, rtol=1e-5, atol=1e-6)
    assert cut.temperature == 2.0 and lm.TeacherTokens.load(tmp_path / "k9").top(9).log_rest.shape == blocks.shape
    with pytest.raises(KdcollapseError, match=r"k must be an int in \[1, 9\]"):
        lm.TeacherTokens.load(tmp_path / "k9").top(10)


def test_an_interrupted_store_resumes_from_its_last_shard_and_equals_an_uninterrupted_one(tmp_path, teacher_and_blocks):
    """store_teacher_tokens after an interruption computes only the shards not yet written (progress.json), and
    the store it finishes is the one an uninterrupted call writes, byte for byte."""
    model, blocks = teacher_and_blocks
    calls = []

    class Interrupted(Exception):
        pass

    def counting(limit):
        def forward(ids):
            if len(calls) == limit:
                raise Interrupted
            calls.append(len(ids))
            return model(ids)
        forward.get_output_embeddings = model.get_output_embeddings
        return forward

    with pytest.raises(Interrupted):  # 10 blocks, shards of 3, batches of 2: stopped in the third shard
        lm.store_teacher_tokens(counting(5), blocks, tmp_path / "a", k=4, batch_size=2, shard_blocks=3)
    assert not (tmp_path / "a" / "manifest.json").exists() and (tmp_path / "a" / "progress.json").is_file()
    with pytest.raises(DataError, match="no complete store"):
        lm.TeacherTokens.load(tmp_path / "a")
    calls.clear()
    lm.store_teacher_tokens(counting(-1), blocks, tmp_path / "a", k=4, batch_size=2, shard_blocks=3)
    assert calls == [2, 1, 1]  # shards 2 and 3 only (blocks 6-8 and 9)
    lm.store_teacher_tokens(model, blocks, tmp_path / "b", k=4, batch_size=2, shard_blocks=3)
    assert not (tmp_path / "a" / "progress.json").exists()
    for name in ("manifest.json", *(f"shard-{i:05d}.safetensors" for i in range(4))):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    # a kept shard whose bytes differ from their SHA-256 is computed again; progress of another k is ignored
    shutil.copytree(tmp_path / "b", tmp_path / "c")
    manifest = (tmp_path / "c" / "manifest.json").read_text()
    (tmp_path / "c" / "manifest.json").rename(tmp_path / "c" / "progress.json")
    (tmp_path / "c" / "shard-00001.safetensors").write_bytes(b"damaged")
    calls.clear()
    lm.store_teacher_tokens(counting(-1), blocks, tmp_path / "c", k=4, batch_size=2, shard_blocks=3)
    assert calls == [2, 1] and (tmp_path / "c" / "manifest.json").read_text() == manifest
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "progress.json").write_text(json.dumps({**json.loads(manifest), "k": 5}))
    calls.clear()
    lm.store_teacher_tokens(counting(-1), blocks, tmp_path / "d", k=4, batch_size=2, shard_blocks=3)
    assert calls == [2, 1] * 3 + [1]
