"""One GKD training step with the teacher online: kdcollapse's ``distill-lm`` step against TRL's ``GKDTrainer``
step on the same teacher, student, batch and optimizer, interleaved in one process (issue 39, item 6: the
online-teacher step ≤ 1.0× TRL's at the recipe's size).

Both sides start from the same student (a copy each) and take the same training blocks of the corpus; a step is
sampling (when on-policy), the student's and the teacher's forward passes, the generalized JSD (β = 0.5) and its
backward, gradient clipping at 1 and an AdamW step. kdcollapse's step is ``train._lm_task._loss`` (what
``LMTrainer.step`` calls per micro-batch) with the teacher online (``teacher_k=null``: no stored tokens);
TRL's is ``GKDTrainer.training_step`` (its ``generate`` with the KV cache, the full logits of both models and
``generalized_jsd_loss``) with its optimizer. Three cells:

- ``on-policy``: every block is the student's completion of its prompt (kdcollapse λ = 1; TRL's step when its
  ``random.random() <= lmbda`` draw samples);
- ``text``: no block is sampled (kdcollapse λ = 0 with the online teacher; TRL's other step);
- ``λ = 0.5``: kdcollapse samples half of every batch; TRL samples the whole batch on half of its steps, so its
  expected step is the mean of the two TRL cells above.

Time is the CPU time of the process per step (``time.process_time``; one torch thread, so it is the work done,
not the machine's load); each round times every variant once in a shuffled order and the table gives medians.

    OMP_NUM_THREADS=1 PYTHONPATH=src nice python benchmarks/bench_onpolicy_trl.py --rounds 7 \\
        --markdown results/benchmarks/onpolicy_trl.md
"""

from __future__ import annotations

import argparse
import copy
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path

import torch

from _timing import shared_machine  # benchmarks/_timing.py
from kdcollapse import lm
from kdcollapse.config_lm import load_lm_config
from kdcollapse.train._lm_task import _loss, _Teacher, cache_dir

RECIPE = Path(__file__).resolve().parents[1] / "configs" / "lm" / "smollm2_tiny.yaml"


def kdcollapse_step(cfg, student, optimizer, teacher, train, micro, eos: int | None):
    optimizer.zero_grad(set_to_none=True)
    loss = _loss(cfg, student, teacher, train, None, micro, torch.Generator().manual_seed(0), eos)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
    optimizer.step()
    return float(loss)


def trl_trainer(student, teacher, tokenizer, args, output_dir: str):
    """TRL's GKDTrainer on ``student`` and ``teacher`` (β = 0.5, TRL's sampling temperature 0.9), its optimizer
    AdamW at the recipe's learning rate."""
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from datasets import Dataset
    from trl.experimental.gkd import GKDConfig, GKDTrainer

    config = GKDConfig(output_dir=output_dir, per_device_train_batch_size=args.batch, lmbda=1.0, beta=0.5,
                       temperature=0.9, max_new_tokens=args.new_tokens, learning_rate=args.lr, weight_decay=0.0,
                       report_to=[], use_cpu=True, bf16=False, fp16=False, max_grad_norm=1.0, seed=0,
                       dataloader_num_workers=0, logging_strategy="no", save_strategy="no")
    dummy = Dataset.from_dict({"messages": [[{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]]})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = GKDTrainer(model=student, teacher_model=teacher, args=config, train_dataset=dummy,
                             processing_class=tokenizer)
    trainer.create_optimizer()
    trainer.current_gradient_accumulation_steps = 1  # what Trainer.train sets before its first step
    return trainer


def trl_step(trainer, blocks: torch.Tensor, prompt: int, on_policy: bool):
    """``GKDTrainer.training_step`` on ``blocks`` (its collator's fields: the prompt masked in the labels), then
    the Trainer's clipping and optimizer step."""
    trainer.lmbda = 1.0 if on_policy else -1.0  # random.random() <= lmbda: always / never sample
    labels = blocks.clone()
    labels[:, :prompt] = -100
    inputs = {"input_ids": blocks.clone(), "attention_mask": torch.ones_like(blocks), "labels": labels,
              "prompts": blocks[:, :prompt].clone(), "prompt_attention_mask": torch.ones_like(blocks[:, :prompt])}
    model = trainer.model
    model.train()
    loss = trainer.training_step(model, inputs)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    trainer.optimizer.step()
    trainer.optimizer.zero_grad(set_to_none=True)
    return float(loss)


def cpu_seconds(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=32, help="sampled tokens after each block's prompt")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--markdown", type=Path)
    args = parser.parse_args()
    torch.set_num_threads(1)
    load_before = os.getloadavg()[0]
    base = load_lm_config(RECIPE)
    block = base.block_size
    prompt = block - args.new_tokens
    overrides = [f"batch_size={args.batch}", "teacher_k=null", "loss.divergence=jsd", "loss.beta=0.5",
                 f"generation.prompt_tokens={prompt}", f"generation.max_new_tokens={args.new_tokens}"]
    configs = {lam: load_lm_config(RECIPE, [*overrides, f"generation.lmbda={lam}"]) for lam in (0.0, 0.5, 1.0)}
    cfg = configs[1.0]
    teacher = _Teacher(cfg.teacher, cache_dir(cfg))
    tokenizer = lm.load_tokenizer(cfg.teacher, cache_dir=cache_dir(cfg))
    blocks, _ = lm.data_blocks(tokenizer, cfg.data_spec, block, cache_dir=cache_dir(cfg))
    train = blocks["train"].ids
    student_config = {"vocab_size": len(tokenizer), **cfg.student}
    start = lm.load_language_model(student_config, tokenizer=tokenizer, seed=0).model.train()
    teacher_model = teacher.model
    ours = copy.deepcopy(start).train()
    ours_opt = torch.optim.AdamW(ours.parameters(), lr=args.lr, weight_decay=0.0)
    with tempfile.TemporaryDirectory() as tmp:
        trainer = trl_trainer(copy.deepcopy(start), teacher_model, tokenizer, args, tmp)
        batches = torch.Generator().manual_seed(0)

        def micro():
            return torch.randint(len(train), (args.batch,), generator=batches)

        timers = {
            **{f"kdcollapse λ = {lam:g}": (lambda c=configs[lam]: kdcollapse_step(
                c, ours, ours_opt, teacher, train, micro(), tokenizer.eos_token_id)) for lam in (0.0, 0.5, 1.0)},
            "TRL on-policy": lambda: trl_step(trainer, train[micro()], prompt, True),
            "TRL text": lambda: trl_step(trainer, train[micro()], prompt, False),
        }
        for fn in timers.values():  # warm-up: no measured step is a variant's first
            fn()
        times: dict[str, list[float]] = {name: [] for name in timers}
        order = torch.Generator().manual_seed(1)
        for r in range(args.rounds):
            names = [list(timers)[i] for i in torch.randperm(len(timers), generator=order)]
            for name in names:
                times[name].append(cpu_seconds(timers[name]))
            print(f"round {r + 1}: " + ", ".join(f"{n} {times[n][-1]:.2f} s" for n in timers), flush=True)
    median = {name: statistics.median(t) for name, t in times.items()}
    trl_half = 0.5 * (median["TRL on-policy"] + median["TRL text"])
    rows = [("on-policy (every block sampled)", "kdcollapse λ = 1", median["kdcollapse λ = 1"],
             "TRL on-policy", median["TRL on-policy"]),
            ("λ = 0.5 (expected step)", "kdcollapse λ = 0.5", median["kdcollapse λ = 0.5"],
             "TRL ½ on-policy + ½ text", trl_half),
            ("text, teacher online", "kdcollapse λ = 0", median["kdcollapse λ = 0"], "TRL text", median["TRL text"])]
    for cell, ours_name, ours_t, trl_name, trl_t in rows:
        print(f"{cell}: {ours_name} {ours_t:.3f} s, {trl_name} {trl_t:.3f} s: {ours_t / trl_t:.3f}x TRL's")
    if args.markdown:
        args.markdown.write_text(render(rows, times, args, cfg, (load_before, os.getloadavg()[0])))


def render(rows, times, args, cfg, load) -> str:
    import trl
    import transformers

    table = ["| cell | kdcollapse | CPU s / step | TRL | CPU s / step | **kdcollapse / TRL** |",
             "|---|---|---|---|---|---|"]
    for cell, ours_name, ours_t, trl_name, trl_t in rows:
        table.append(f"| {cell} | {ours_name} | {ours_t:.3f} | {trl_name} | {trl_t:.3f} | **{ours_t / trl_t:.3f}×** |")
    spread = ["| variant | CPU s per round |", "|---|---|"]
    spread += [f"| {name} | {', '.join(f'{x:.2f}' for x in t)} |" for name, t in times.items()]
    return "\n".join([
        f"{shared_machine(load)}, CPU capability {torch.backends.cpu.get_cpu_capability()}, TRL {trl.__version__}, "
        f"transformers {transformers.__version__}, float32, batch {args.batch} blocks of {cfg.block_size} tokens, "
        f"{args.new_tokens} sampled after a {cfg.block_size - args.new_tokens}-token prompt, {args.rounds} rounds.",
        "", *table, "", *spread, ""])


if __name__ == "__main__":
    main()
