"""What one training step of the pruned-student LM study's missing arms costs (studies/lm_distillation_pruned,
issue 40 items 3 and 6), against the study's own step (forward KL on the teacher's stored top-64 tokens), in one
process on one thread, bf16 autocast of the student's body as the study:

- **stored forward KL** (the baseline): the 15-layer student s15 (layers 0-4 + 20-29 of SmolLM2-135M), 8 blocks of
  256 tokens, the loss of ``distill-lm`` on stored top-64 tokens, backward, AdamW;
- **GKD on-policy** (λ = 0.5, JSD β = 0.5): the same step with half of the blocks replaced by the student's
  completions (128 sampled tokens after a 128-token prompt) that the teacher scores online;
- **DistiLLM-2** (``loss.divergence=distillm2 generation.seq_kd=true generation.lmbda=0.5``): the teacher completes
  half of the blocks, the student answers the same prompts, the teacher scores all 8 blocks online;
- **across tokenizers** (``student_tokenizer``, a byte-level BPE of ``--vocab-size`` tokens trained on the training
  split, ``kdcollapse train-tokenizer``): a randomly initialised student of s15's shape with that vocabulary
  (``student.init`` is refused across tokenizers), 8 paired rows of at most 256 tokens, ULD with the teacher online
  (``loss.ce_weight`` 1, ``distill_weight`` 1), and its cross-entropy-only control (no teacher).

The one-tokenizer steps are timed interleaved (each round in a shuffled order) on one s15 student and optimizer; the
cross-tokenizer steps afterwards on their own student (one 15-layer student and its AdamW state in memory at a
time). CPU time of this process (``time.process_time``): the machine is shared. Ratios are to the stored
forward-KL step of the same process.

    nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_lm_arms_costs.py
    nice -n 10 env OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/bench_lm_arms_costs.py --stored-only \\
        --docs 40 --student-tokenizer studies/lm_distillation_pruned/bpe8192

(the second: the cross-tokenizer steps on the 8 fullest rows of 40 documents, as full as a run's; the page:
results/benchmarks/lm_arms_costs.md). The cross-tokenizer rows are the 8 with the most student tokens of the
``--docs`` documents (a run's rows hold 243 student tokens on average).
"""

from __future__ import annotations

import argparse
import os
import resource
import tempfile
import time
from pathlib import Path

import torch

from _timing import cpu_model, emit, interleave, timer  # benchmarks/_timing.py
from kdcollapse import lm
from kdcollapse.distributed import cpu_capability
from kdcollapse.train import load_lm_config
from kdcollapse.train._lm_cross import cross_tokenizer_loss
from kdcollapse.train._lm_task import _loss, _Teacher, cache_dir

S15 = [0, 1, 2, 3, 4, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29]
R15 = {"model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 15,
       "num_attention_heads": 9, "num_key_value_heads": 3, "head_dim": 64, "max_position_embeddings": 8192,
       "rms_norm_eps": 1.0e-5, "rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"},
       "tie_word_embeddings": True}
BASE = ["precision=bf16", "block_size=256", "batch_size=8", "steps=123", "warmup=12", "progress=false"]
ARMS = {  # name: the distill-lm overrides of its step (the study's)
    "stored forward KL (the study's step)": ["loss.divergence=forward_kl", "teacher_k=64"],
    "GKD on-policy (λ = 0.5, JSD β = 0.5)": ["loss.divergence=jsd", "loss.beta=0.5", "generation.lmbda=0.5",
                                             "teacher_k=64"],
    "DistiLLM-2 (seq_kd, λ = 0.5)": ["loss.divergence=distillm2", "generation.seq_kd=true", "generation.lmbda=0.5",
                                     "teacher_k=64"],
}
BASELINE = next(iter(ARMS))


def rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


def one_tokenizer_steps(args, teacher, tokenizer, batch) -> dict[str, float]:
    """Median CPU-s of one optimizer step of each arm of :data:`ARMS` on s15 (interleaved rounds)."""
    tmp = Path(tempfile.mkdtemp(prefix="bench-lm-arms-"))
    stored = lm.TeacherTokens.load(lm.store_teacher_tokens(teacher.model, batch, tmp / "train", k=64))
    student = lm.student_from_teacher(teacher.model, S15).train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
    micro = torch.arange(len(batch))

    def step_of(cfg):
        def step():
            optimizer.zero_grad(set_to_none=True)
            _loss(cfg, student, teacher, batch, stored, micro, torch.Generator().manual_seed(0),
                  tokenizer.eos_token_id).backward()
            optimizer.step()
        return step
    arms = {BASELINE: ARMS[BASELINE]} if args.stored_only else ARMS
    steps = {name: step_of(load_lm_config(None, BASE + overrides)) for name, overrides in arms.items()}
    for step in steps.values():  # warm-up
        step()
    seconds = interleave({name: timer(step, cpu=True) for name, step in steps.items()}, args.rounds)
    del student, optimizer
    return seconds


def cross_tokenizer_steps(args, teacher, teacher_tokenizer) -> tuple[dict[str, float], dict]:
    """Median CPU-s of one step of ULD and of cross-entropy only, a random s15-shaped student with the BPE's
    vocabulary, 8 paired rows of the training split; and what those rows hold."""
    bpe_dir = args.student_tokenizer
    if bpe_dir is None:
        bpe_dir = Path(tempfile.mkdtemp(prefix="bench-lm-bpe-")) / "bpe"
        lm.train_bpe_tokenizer(bpe_dir, args.vocab_size)
    tokenizer = lm.load_tokenizer(bpe_dir)
    docs = [d for d in lm.read_documents() if d.split == "train"][:args.docs]
    examples = [lm.Example(d.name, "text", text=d.text) for d in docs]
    rows = lm.paired_blocks(tokenizer, teacher_tokenizer, examples, 256)["train"]
    rows = rows.select(rows.student.targets.sum(1).argsort(descending=True, stable=True)[:8])  # the 8 fullest rows
    vocab = (len(tokenizer), len(teacher_tokenizer))
    student = lm.load_language_model({"vocab_size": len(tokenizer), **R15}, tokenizer=tokenizer, seed=0).model.train()
    optimizer = torch.optim.AdamW(student.parameters(), lr=1e-5)
    configs = {"across tokenizers: ULD (CE + ULD, teacher online)": (["loss.divergence=uld"], teacher.model),
               "across tokenizers: cross-entropy only (the control)": (["loss.divergence=none"], None)}

    def step_of(overrides, model):
        cfg = load_lm_config(None, BASE + [f"student_tokenizer={bpe_dir}", "teacher_k=null", "loss.ce_weight=1",
                                           "loss.distill_weight=1"] + overrides)

        def step():
            optimizer.zero_grad(set_to_none=True)
            cross_tokenizer_loss(cfg, student, model, rows, vocab, None).backward()
            optimizer.step()
        return step
    steps = {name: step_of(*value) for name, value in configs.items()}
    for step in steps.values():
        step()
    seconds = interleave({name: timer(step, cpu=True) for name, step in steps.items()}, args.rounds)
    s_counted = int(rows.student.targets[:, 1:].sum())
    info = {"parameters": sum(p.numel() for p in student.parameters()), "vocab": len(tokenizer),
            "student_tokens": s_counted, "teacher_tokens": int(rows.teacher.targets[:, 1:].sum()),
            "bytes": int(rows.student.predicted_bytes().sum())}
    del student, optimizer
    return seconds, info


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved timed rounds (after one warm-up)")
    parser.add_argument("--vocab-size", type=int, default=8192, help="the student's BPE (trained here if no dir)")
    parser.add_argument("--student-tokenizer", type=Path, help="a trained BPE directory (kdcollapse train-tokenizer)")
    parser.add_argument("--docs", type=int, default=8, help="training documents the blocks and rows are cut from")
    parser.add_argument("--stored-only", action="store_true",
                        help="of the one-tokenizer steps, time the stored forward-KL step only (the ratios' baseline)")
    parser.add_argument("--run-overhead", type=float, default=1300.0,
                        help="CPU-s of one study run (251,904 tokens) of the stored step, to scale the arms' runs")
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    head = (f"Machine: {cpu_model()}, CPU capability {cpu_capability()}, torch {torch.__version__}, "
            f"{torch.get_num_threads()} thread; load average {os.getloadavg()[0]:.1f} at the start. bf16 autocast of "
            f"the student's body; blocks of 256 tokens, 8 per step (2,048 tokens); medians of {args.rounds} "
            "interleaved rounds after a warm-up, CPU seconds of this process.")
    print(head, flush=True)
    teacher = _Teacher(lm.SMOLLM2, cache_dir(load_lm_config(None, [])))
    tokenizer = lm.load_tokenizer(lm.SMOLLM2, cache_dir=cache_dir(load_lm_config(None, [])))
    train_docs = [d for d in lm.read_documents() if d.split == "train"][:args.docs]
    ids = torch.cat([torch.tensor(tokenizer(d.text)["input_ids"] + [tokenizer.eos_token_id]) for d in train_docs])
    batch = ids[:8 * 256].view(8, 256)
    began = time.process_time()
    seconds = one_tokenizer_steps(args, teacher, tokenizer, batch)
    print({k: round(v, 2) for k, v in seconds.items()}, f"max RSS {rss_gib():.2f} GiB", flush=True)
    cross, info = cross_tokenizer_steps(args, teacher, tokenizer)
    print({k: round(v, 2) for k, v in cross.items()}, info, f"max RSS {rss_gib():.2f} GiB", flush=True)
    base = seconds[BASELINE]
    steps, runs = 123, 5  # a run: 123 steps; an arm: the rate grid's 3 runs at seed 0 and seeds 1, 2
    rows = ["| step | CPU-s per step | CPU-s per training token | × the stored forward-KL step | CPU-h per run of 123 "
            "steps (estimate) | CPU-h of the arm (3 rates + 2 seeds) |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    for name, s in {**seconds, **cross}.items():
        run_h = (args.run_overhead + steps * (s - base)) / 3600
        tokens = info["student_tokens"] if name in cross else 2048  # a cross step: the student's counted tokens
        rows.append(f"| {name} | {s:.1f} | {s / tokens:.4f} | {s / base:.2f} | {run_h:.2f} | {runs * run_h:.1f} |")
    text = "\n".join([head, "", *rows, "",
                      f"Across tokenizers: the student has {info['parameters']:,} parameters ({info['vocab']:,}-token "
                      f"BPE); its 8 rows count {info['student_tokens']:,} student tokens, {info['teacher_tokens']:,} "
                      f"teacher tokens, {info['bytes']:,} bytes. A run's estimate: --run-overhead "
                      f"{args.run_overhead:.0f} CPU-s (the study's stored-token run) + 123 × (the step − the stored "
                      f"step). Max RSS {rss_gib():.2f} GiB; {time.process_time() - began:.0f} CPU-s in all.", ""])
    emit(text, args.markdown)


if __name__ == "__main__":
    main()
