"""`kdcollapse train-tokenizer` / `kdcollapse.lm.train_bpe_tokenizer`: a byte-level BPE learnt from the training
documents of a corpus only, the same files twice, a Hugging Face directory that encodes every string and that
distill-lm's loaders open, and bad input refused before anything is written."""

import json

import pytest

from kdcollapse import lm
from kdcollapse.cli import main

pytest.importorskip("tokenizers")
pytest.importorskip("transformers")
from tiny_lm import TEXT  # noqa: E402

HELD_OUT = "zqxv zqxv zqxv " * 50  # a string only held-out documents hold: no merge may come from it


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "corpus"
    root.mkdir()
    for i, text in enumerate(TEXT * 2):  # doc0..doc15: doc9 and doc13 are test, doc15 validation (split_of)
        (root / f"doc{i}.txt").write_text(HELD_OUT if lm.split_of(f"doc{i}.txt") != "train" else text * 3)
    assert {lm.split_of(f"doc{i}.txt") for i in range(16)} == {"train", "validation", "test"}
    return root


def files(directory):
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def test_the_same_training_split_gives_the_same_files_and_a_tokenizer_of_the_training_text_only(corpus, tmp_path):
    first = lm.train_bpe_tokenizer(tmp_path / "a", 300, corpus)
    lm.train_bpe_tokenizer(tmp_path / "b", 300, corpus)
    assert files(tmp_path / "a") == files(tmp_path / "b")
    assert set(files(tmp_path / "a")) >= {"tokenizer.json", "tokenizer_config.json", "kdcollapse_tokenizer.json"}
    train = [d for d in lm.read_documents(corpus) if d.split == "train"]
    assert first["documents"] == len(train) == 13 and first["split"] == "train" and first["tokens"] == 300
    tokenizer = lm.load_tokenizer(tmp_path / "a")
    assert len(tokenizer) == 300 and tokenizer.eos_token == tokenizer.pad_token == "<|endoftext|>"
    assert tokenizer.convert_tokens_to_ids("<|endoftext|>") == 0
    vocabulary = tokenizer.get_vocab()
    assert not any("zq" in token or "xv" in token for token in vocabulary)  # no merge from held-out text
    assert any(len(token) > 3 for token in vocabulary)  # merges were learnt (from the training text)
    for text in ["The cat sat on the mat.", "zqxv ünïcödé → 字", ""]:  # byte-level: every string round-trips
        assert tokenizer.decode(tokenizer(text)["input_ids"]) == text
    # another split or size is another tokenizer; the manifest names the training text by its digest
    other = lm.train_bpe_tokenizer(tmp_path / "c", 300, corpus, split="validation")
    assert other["documents"] == 1 and other["text_sha256"] != first["text_sha256"]
    assert any("zq" in token for token in lm.load_tokenizer(tmp_path / "c").get_vocab())


def test_the_command_writes_the_directory_and_prints_its_manifest(corpus, tmp_path, capsys):
    out = tmp_path / "bpe"
    assert main(["train-tokenizer", str(out), "--vocab-size", "280", "--corpus", str(corpus)]) == 0
    manifest = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert manifest == json.loads((out / "kdcollapse_tokenizer.json").read_text()) and manifest["tokens"] == 280
    assert main(["train-tokenizer", str(out), "--vocab-size", "300", "--corpus", str(corpus), "--overwrite"]) == 0
    assert len(lm.load_tokenizer(out)) == 300


@pytest.mark.parametrize("args, words", [
    (["--vocab-size", "100"], ["vocab_size", "100", "257"]),
    (["--vocab-size", "ten"], ["ten"]),
    (["--vocab-size", "300", "--split", "dev"], ["split", "dev", "train, validation"]),
    (["--vocab-size", "300", "--min-frequency", "0"], ["min_frequency", "0"]),
    (["--vocab-size", "300", "--corpus", "/nonexistent/corpus"], ["/nonexistent/corpus"]),
    (["--vocab-size", "300", "--existing"], ["exists", "--overwrite"]),
])
def test_bad_input_is_one_error_line_and_writes_nothing(corpus, tmp_path, capsys, args, words):
    out = tmp_path / "bpe"
    if "--existing" in args:
        args = [a for a in args if a != "--existing"]
        out.mkdir()
        (out / "keep.txt").write_text("mine")
    before = sorted(p.name for p in tmp_path.iterdir())
    assert main(["train-tokenizer", str(out), "--corpus", str(corpus), *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and all(w in err[0] for w in words), err
    assert sorted(p.name for p in tmp_path.iterdir()) == before
    assert not out.exists() or files(out) == {"keep.txt": b"mine"}
