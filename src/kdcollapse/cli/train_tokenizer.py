"""``kdcollapse train-tokenizer``: a byte-level BPE trained on the training split of a corpus, saved as a Hugging
Face tokenizer directory (the ``student_tokenizer`` of a ``distill-lm`` run across tokenizers)."""

from __future__ import annotations

_EXAMPLES = """examples:
  kdcollapse train-tokenizer bpe-8192/ --vocab-size 8192        # python-docs, training documents only
  kdcollapse train-tokenizer my-bpe/ --vocab-size 4096 --corpus ./texts
  kdcollapse distill-lm --config lm/smollm2_tiny student_tokenizer=bpe-8192/ teacher_k=null loss.divergence=uld
"""


def register(subparsers) -> None:
    from kdcollapse.cli._common import HelpFormatter

    text = "Train a byte-level BPE tokenizer on a corpus's training split (deterministic: same files every time)."
    p = subparsers.add_parser("train-tokenizer", help=text, description=text, epilog=_EXAMPLES,
                              formatter_class=HelpFormatter)
    p.add_argument("out", help="the tokenizer directory to write (must not exist or be empty, unless --overwrite)")
    p.add_argument("--vocab-size", type=int, required=True, help="tokens of the vocabulary (>= 257)")
    p.add_argument("--corpus", default="python-docs", help="python-docs or a directory of .txt files")
    p.add_argument("--split", default="train", help="the documents it learns from: train, validation or test")
    p.add_argument("--min-frequency", type=int, default=2, help="the fewest occurrences of a merged pair")
    p.add_argument("--overwrite", action="store_true", help="replace the directory out")
    p.set_defaults(func=_run)


def _run(args) -> int:
    import json

    from kdcollapse.cli._common import check_output
    from kdcollapse.lm import train_bpe_tokenizer

    check_output(args.out, "out", folder=True)
    manifest = train_bpe_tokenizer(args.out, args.vocab_size, args.corpus, split=args.split,
                                   min_frequency=args.min_frequency, overwrite=args.overwrite)
    print(f"{args.out}: byte-level BPE of {manifest['tokens']:,} tokens from {manifest['documents']} {args.split} "
          f"documents of {args.corpus}")
    print(json.dumps(manifest))
    return 0
