"""Tiny language models, a tiny tokenizer and a tiny text corpus that tests share (no download, no
90 MB model): a byte-level BPE trained in milliseconds on a few sentences, random Llama/GPT-2 configs."""

import json
from pathlib import Path

TEXT = [
    "The cat sat on the mat. The dog sat on the log.",
    "A language model predicts the next token from the tokens before it.",
    "Knowledge distillation trains a small student to match a large teacher.",
    "The teacher assigns probabilities to every token of the vocabulary.",
    "Collapse of the features: class means form a simplex, variability shrinks.",
    "Python is a programming language that lets you work quickly.",
    "Each document is split into train, validation or test by its name.",
    "Short sentences make a tiny corpus for the tests of a language model.",
]


def tiny_tokenizer(vocab_size: int = 300):
    """A byte-level BPE (every string encodes) with ``<|endoftext|>`` as end of text and padding."""
    import tokenizers
    from transformers import PreTrainedTokenizerFast

    bpe = tokenizers.ByteLevelBPETokenizer()
    bpe.train_from_iterator(TEXT * 4, vocab_size=vocab_size, special_tokens=["<|endoftext|>"],
                            show_progress=False)
    return PreTrainedTokenizerFast(tokenizer_object=bpe._tokenizer, eos_token="<|endoftext|>",
                                   pad_token="<|endoftext|>")


def with_bos(tokenizer):
    """``tokenizer`` putting a ``<bos>`` token before every text, as Gemma's and Llama's do."""
    from tokenizers.processors import TemplateProcessing

    tokenizer.add_special_tokens({"bos_token": "<bos>"})
    bos = tokenizer.convert_tokens_to_ids("<bos>")
    tokenizer._tokenizer.post_processor = TemplateProcessing(single="<bos> $A", special_tokens=[("<bos>", bos)])
    return tokenizer, bos


def llama_config(vocab_size: int, hidden: int = 32, layers: int = 2, **extra) -> dict:
    return {"model_type": "llama", "vocab_size": vocab_size, "hidden_size": hidden,
            "intermediate_size": 2 * hidden, "num_hidden_layers": layers, "num_attention_heads": 2,
            "num_key_value_heads": 1, "max_position_embeddings": 128, "tie_word_embeddings": True, **extra}


def gpt2_config(vocab_size: int, hidden: int = 32, layers: int = 1, **extra) -> dict:
    return {"model_type": "gpt2", "vocab_size": vocab_size, "n_embd": hidden, "n_layer": layers, "n_head": 2,
            "n_positions": 128, **extra}


def write_corpus(root: Path, copies: int = 5) -> Path:
    """``copies`` × len(TEXT) small documents under ``root`` (nested folders, one empty file)."""
    for i in range(copies):
        for j, line in enumerate(TEXT):
            path = root / f"part{i}" / f"doc{j}.txt"
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(f"{line} (copy {i})\n{line}\n", encoding="utf-8")
    (root / "empty.txt").write_text("  \n", encoding="utf-8")
    return root


def distill_lm_files(root: Path, tokenizer=None, teacher_hidden: int = 48, teacher_layers: int = 2,
                     student_layers: int = 1, copies: int = 12) -> tuple[dict, list[str]]:
    """What a tiny ``distill-lm`` run reads, written under ``root``: ``teacher/``, a random Llama (seed 0) saved
    with ``tokenizer`` (by default :func:`tiny_tokenizer`), and ``corpus/`` (:func:`write_corpus`). Returns the
    student's config (a Llama of hidden size 16 with ``student_layers`` layers; its vocabulary is the
    tokenizer's) and the options naming the teacher, the corpus, a cache under ``root`` and that student."""
    from kdcollapse import lm

    tokenizer = tiny_tokenizer() if tokenizer is None else tokenizer
    teacher = lm.load_language_model(llama_config(len(tokenizer), hidden=teacher_hidden, layers=teacher_layers),
                                     tokenizer=tokenizer, seed=0)
    teacher.model.save_pretrained(root / "teacher")
    tokenizer.save_pretrained(root / "teacher")
    write_corpus(root / "corpus", copies=copies)
    student = {k: v for k, v in llama_config(0, hidden=16, layers=student_layers).items() if k != "vocab_size"}
    return student, [f"teacher={root / 'teacher'}", f"corpus={root / 'corpus'}", f"cache_dir={root / 'cache'}",
                     f"student={json.dumps(student)}"]
