"""What the pruned-student LM study (studies/lm_distillation_pruned/) costs and where its students start, measured
in one process on one thread: the teacher's forward (tokens per CPU-second, float32 and bf16 autocast), a training
step of a 10- and a 15-layer student built from the teacher's layers (forward + backward + AdamW on stored top-64
teacher tokens, the loss of ``distill-lm``; tokens per CPU-second, bf16 autocast and float32), and the validation
perplexity before training of the candidate layer rules (Minitron block influence, DistilBERT every-other, the
issue's 0–7 + 23–29, a random initialisation of the same shape).

CPU time (``time.process_time``) rather than wall time: the machine is shared, and one thread's CPU time is what a
study run spends. Ratios are within this process (bf16 / float32 of the same model and batch).

    nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_lm_study_costs.py
    nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_lm_study_costs.py --steps-only \\
        --step-keeps 10
    nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_lm_study_costs.py --scan 15 10 \\
        --markdown studies/lm_distillation_pruned/block_scan.md
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import tempfile
import time
from pathlib import Path

import torch

from _timing import cpu_model, emit, median_seconds  # benchmarks/_timing.py
from kdcollapse import lm
from kdcollapse.config_lm import LMConfig
from kdcollapse.distributed import cpu_capability
from kdcollapse.train._lm_task import _loss, _Teacher, cache_dir, evaluate, select, teacher_tokens


def perplexities_and_forward(args, cfg, teacher, model, train, val, key, batch, rows):
    """The teacher's forward (a row of ``rows``) and the validation perplexity before training of every candidate
    student (the table's rows, returned with the forward's CPU seconds by precision)."""
    tokens = batch.numel()
    # ---- the teacher's forward
    with torch.no_grad():
        fwd = {bf16: median_seconds(lambda: [model(batch).logits.float().topk(64)] if not bf16 else
                                    _bf16_forward(model, batch), args.repeats, cpu=True) for bf16 in (False, True)}
    rows.append(f"| teacher forward + top-64 (30 layers) | {tokens / fwd[False]:.0f} | {tokens / fwd[True]:.0f} | "
                f"{fwd[True] / fwd[False]:.2f} |")
    print(rows[-1])

    # ---- students: perplexity before training, train step cost
    val_ref = teacher_tokens(cfg, teacher, key, "validation", val, 64)
    n = model.config.num_hidden_layers
    calibration = train[:32]
    candidates = {}
    for keep in (15, 10):
        candidates[f"minitron, keep {keep}"] = lm.minitron_layers(model, calibration, keep)
        candidates[f"distilbert, keep {keep}"] = lm.distilbert_layers(n, keep)
    candidates["first 8 + last 7 (issue 40: 0-7, 23-29)"] = list(range(8)) + list(range(23, 30))
    candidates["first 5 + last 5 (0-4, 25-29)"] = list(range(5)) + list(range(25, 30))
    # the lowest calibration perplexity of --scan (the study's students)
    candidates["scan, keep 15 (drop 5-19)"] = list(range(5)) + list(range(20, 30))
    candidates["scan, keep 10 (drop 4-23)"] = list(range(4)) + list(range(24, 30))
    ppl = ["| student | layers kept | parameters | validation perplexity before training |",
           "| --- | --- | ---: | ---: |"]
    teacher_eval = evaluate(model, val, val_ref, cfg)
    ppl.append(f"| teacher (SmolLM2-135M) | all {n} | {sum(p.numel() for p in model.parameters()):,} | "
               f"{teacher_eval['perplexity']:.2f} |")
    print(ppl[-1])
    for name, layers in candidates.items():
        student = lm.student_from_teacher(model, layers)
        result = evaluate(student, val, val_ref, cfg)
        ppl.append(f"| {name} | {_ranges(layers)} | {sum(p.numel() for p in student.parameters()):,} | "
                   f"{result['perplexity']:,.1f} |")
        print(ppl[-1])
    for keep in (15, 10):
        config = model.config.__class__.from_dict(model.config.to_dict())
        config.num_hidden_layers = keep
        torch.manual_seed(0)
        import transformers
        student = transformers.AutoModelForCausalLM.from_config(config).eval()
        result = evaluate(student, val, val_ref, cfg)
        ppl.append(f"| random initialisation, {keep} layers (seed 0) | none | "
                   f"{sum(p.numel() for p in student.parameters()):,} | {result['perplexity']:,.1f} |")
        print(ppl[-1])

    return ppl, fwd


def autocast(bf16: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--block-size", type=int, default=256)
    parser.add_argument("--batch", type=int, default=8, help="blocks per forward / per training step")
    parser.add_argument("--eval-blocks", type=int, default=16, help="validation blocks of the perplexities")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--markdown", type=Path)
    parser.add_argument("--scan", type=int, nargs="+", metavar="KEEP",
                        help="instead: the perplexity on --scan-blocks training blocks of every student keeping KEEP "
                             "layers by dropping one contiguous block (the LM-loss criterion of depth pruning)")
    parser.add_argument("--scan-blocks", type=int, default=4)
    parser.add_argument("--step-keeps", type=int, nargs="+", default=[15, 10], metavar="KEEP",
                        help="the students (layer counts) whose training step is timed")
    parser.add_argument("--steps-only", action="store_true",
                        help="time the training steps only (no teacher forward, no perplexities: less memory)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.scan:
        return scan(args)
    lines = [f"Machine: {cpu_model()}, CPU capability {cpu_capability()}, torch {torch.__version__}, "
             f"{torch.get_num_threads()} thread; load average {os.getloadavg()[0]:.1f} at the start. "
             f"Blocks of {args.block_size} tokens, {args.batch} per step; medians of {args.repeats} timed calls "
             f"after a warm-up, CPU seconds of this process.", ""]
    print(lines[0])
    cfg = LMConfig(block_size=args.block_size, train_blocks=None, eval_blocks=args.eval_blocks, batch_size=args.batch,
                   steps=1, warmup=0, progress=False)
    start = time.process_time()
    teacher = _Teacher(cfg.teacher, cache_dir(cfg))
    model = teacher.model
    load_s = time.process_time() - start
    tokenizer = lm.load_tokenizer(cfg.teacher, cache_dir=cache_dir(cfg))
    splits, key = lm.data_blocks(tokenizer, cfg.data_spec, cfg.block_size, cache_dir=cache_dir(cfg))
    train = splits["train"].ids
    val = select(splits["validation"], args.eval_blocks).ids
    lines.append(f"Teacher loaded from its cache in {load_s:.1f} CPU-s. Corpus blocks: "
                 + ", ".join(f"{s} {len(b)} ({len(b) * args.block_size:,} tokens)" for s, b in splits.items()) + ".")
    lines.append("")
    batch = train[:args.batch]
    tokens = batch.numel()

    rows = ["| what | float32 tokens/CPU-s | bf16 tokens/CPU-s | bf16 / float32 time |", "| --- | ---: | ---: | ---: |"]
    ppl, fwd = [], {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-lm-study-"))
    stored = lm.TeacherTokens.load(lm.store_teacher_tokens(model, batch, tmp / "train", k=64))
    if not args.steps_only:
        ppl, fwd = perplexities_and_forward(args, cfg, teacher, model, train, val, key, batch, rows)
    for keep in args.step_keeps:  # the step's cost depends on the number of layers, not on which
        student = lm.student_from_teacher(model, lm.distilbert_layers(model.config.num_hidden_layers, keep)).train()
        optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
        micro = torch.arange(args.batch)
        for bf16 in (False, True):
            step_cfg = LMConfig(block_size=args.block_size, batch_size=args.batch, steps=1, warmup=0,
                                precision="bf16" if bf16 else "float32", progress=False)

            def step():
                optimizer.zero_grad(set_to_none=True)
                _loss(step_cfg, student, teacher, batch, stored, micro, torch.Generator().manual_seed(0),
                      tokenizer.eos_token_id).backward()
                optimizer.step()
            seconds = median_seconds(step, args.repeats, cpu=True)
            fwd[(keep, bf16)] = seconds
        rows.append(f"| training step of a {keep}-layer student (forward KL on stored top-64, AdamW) | "
                    f"{tokens / fwd[(keep, False)]:.0f} | {tokens / fwd[(keep, True)]:.0f} | "
                    f"{fwd[(keep, True)] / fwd[(keep, False)]:.2f} |")
        print(rows[-1])
        del student, optimizer  # one student in memory at a time
    lines += rows + [""] + ppl + [""]
    text = "\n".join(lines) + "\n"
    emit(text, args.markdown)


@torch.no_grad()
def scan(args) -> None:
    """Every contiguous block of n - keep layers dropped in turn: the perplexity on the first ``--scan-blocks``
    training blocks (calibration text, not the validation split), lowest first."""
    cfg = LMConfig(block_size=args.block_size, train_blocks=None, progress=False)
    model = _Teacher(cfg.teacher, cache_dir(cfg)).model
    tokenizer = lm.load_tokenizer(cfg.teacher, cache_dir=cache_dir(cfg))
    splits, _ = lm.data_blocks(tokenizer, cfg.data_spec, cfg.block_size, cache_dir=cache_dir(cfg))
    blocks = splits["train"].ids[:args.scan_blocks]
    n = model.config.num_hidden_layers
    lines = [f"Machine: {cpu_model()}, CPU capability {cpu_capability()}, torch {torch.__version__}, 1 thread. "
             f"Perplexity on the first {args.scan_blocks} training blocks of {args.block_size} tokens (float32) of "
             "the teacher with one contiguous block of layers dropped.", ""]
    for keep in args.scan:
        size = n - keep
        rows = []
        for start in range(n - size + 1):
            layers = [i for i in range(n) if not start <= i < start + size]
            student = lm.student_from_teacher(model, layers)
            logits = student(blocks).logits[:, :-1].float()
            ce = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), blocks[:, 1:].reshape(-1))
            rows.append((math.exp(float(ce)), start, layers))
            print(f"keep {keep}: drop {start}-{start + size - 1}: {rows[-1][0]:,.1f}", flush=True)
        lines += [f"| keep {keep}: layers dropped | layers kept | calibration perplexity |", "| --- | --- | ---: |"]
        lines += [f"| {s}-{s + size - 1} | {_ranges(kept)} | {p:,.1f} |" for p, s, kept in sorted(rows)] + [""]
    text = "\n".join(lines) + "\n"
    print(text)
    if args.markdown:
        args.markdown.write_text(text)


def _bf16_forward(model, batch):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return model(batch).logits.float().topk(64)


def _ranges(layers: list[int]) -> str:
    out, start = [], layers[0]
    for prev, cur in zip(layers, layers[1:] + [math.inf]):
        if cur != prev + 1:
            out.append(f"{start}" if start == prev else f"{start}-{prev}")
            start = cur
    return ", ".join(out)


if __name__ == "__main__":
    main()
