"""``kdcollapse distill-lm``: distil a causal language model into a small student on a text corpus.

A command of its own rather than a section of ``distill``: the image run config (a registered dataset,
a zoo model, a method, epochs) has nothing to say about tokenizers, token blocks or a transformers
config, and a language-model section would leave most of it unused."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

_EXAMPLES = """examples:
  kdcollapse distill-lm --config lm/smollm2_tiny            # a shipped recipe (kdcollapse recipes list 'lm/*')
  kdcollapse distill-lm --config my_run.yaml --baseline     # a YAML file; also the CE-only student
  kdcollapse distill-lm --config lm/smollm2_tiny loss.divergence=jsd loss.beta=0.5 seed=1
  kdcollapse distill-lm --resume runs/lm/smollm2_tiny
  kdcollapse distill-lm --config lm/smollm2_tiny teacher_k=null loss.divergence=jsd \\
      loss.beta=0.5 generation.lmbda=0.5                  # GKD: half of each batch sampled by the student
  torchrun --nproc_per_node=2 -m kdcollapse distill-lm --config lm/smollm2_tiny batch_size=4
  kdcollapse distill-lm student_tokenizer=my_tokenizer/ loss.divergence=uld \
      teacher_k=null                                      # across tokenizers: ULD (or gold)
"""


def register(subparsers) -> None:
    from kdcollapse.cli._common import HelpFormatter

    text = "Distil a causal language model (HF directory, GGUF, SmolLM2-135M) into a small student."
    p = subparsers.add_parser("distill-lm", help=text, description=text, epilog=_EXAMPLES,
                              formatter_class=HelpFormatter)
    p.add_argument("--config", metavar="FILE", help="YAML config (keys: kdcollapse.train.LMConfig) or a recipe "
                   "name ('lm/smollm2_tiny'; kdcollapse recipes list 'lm/*')")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace the run in run_dir (its files only)")
    p.add_argument("--prepare-only", action="store_true",
                   help="compute and cache what a run of this config reads (the corpus blocks, the teacher's stored "
                        "tokens, its reference on the held-out blocks), then exit: no run directory is written. "
                        "Once before a study or a SLURM array whose runs share them")
    p.add_argument("--baseline", action="store_true",
                   help="also train the cross-entropy-only student (RUN_DIR-ce) and print both perplexities")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from kdcollapse.config_lm import LM_RESUMABLE_KEYS
    from kdcollapse.distributed import distributed_teardown, is_main_process
    from kdcollapse.errors import ConfigError
    from kdcollapse.train import distill_lm, load_lm_config, refuse_old_format, teacher_comparison

    if args.resume:
        if args.config:
            raise ConfigError("--resume takes its config from the run directory; drop --config")
        refused = sorted({o.split("=", 1)[0].strip() for o in args.overrides} - set(LM_RESUMABLE_KEYS))
        if refused:  # anything else would continue another run (the schedule, the data, the loss)
            raise ConfigError(
                f"cannot resume: the run was trained with its own {', '.join(refused)}; a resume may change only "
                f"{', '.join(LM_RESUMABLE_KEYS)}; start a new run_dir for anything else")
        refuse_old_format(Path(args.resume))  # before its config, whose keys may be an older version's
        cfg = load_lm_config(Path(args.resume) / "config.yaml", args.overrides)
        cfg.run_dir = args.resume
    else:
        from kdcollapse.recipes import config_file

        cfg = load_lm_config(config_file(args.config) if args.config else None, args.overrides)
    if args.prepare_only:
        if args.resume or args.baseline or args.overwrite:
            raise ConfigError("--prepare-only trains nothing: drop --resume, --baseline and --overwrite")
        from kdcollapse.train import cache_dir, lm_task

        began = time.process_time()
        task = lm_task(cfg)
        task.prepare()
        stored = "" if getattr(task, "stored", None) is None else (
            f", the teacher's top-{cfg.teacher_k} tokens of {len(task.train)} training blocks")
        reference = ", the teacher's reference on the held-out blocks" if getattr(task, "references", None) else ""
        print(f"prepared (cached under {cache_dir(cfg)}): the corpus blocks{stored}{reference}; "
              f"{time.process_time() - began:.0f} CPU-s")
        return 0
    with distributed_teardown():  # under torchrun: leave the process group together
        results = {"distilled": distill_lm(cfg, resume=bool(args.resume), overwrite=args.overwrite)}
        if args.baseline:  # cross-entropy on the corpus text only: no divergence, no sampled blocks
            ce = dataclasses.replace(
                cfg, run_dir=f"{cfg.run_dir}-ce", generation=dataclasses.replace(cfg.generation, lmbda=0.0, seq_kd=False),
                loss=dataclasses.replace(cfg.loss, divergence="none", ce_weight=1.0, distill_weight=0.0))
            results["ce_only"] = distill_lm(ce, resume=bool(args.resume), overwrite=args.overwrite)
    if not is_main_process():
        return 0
    for name, record in results.items():
        kl = f", forward KL per token {record['test_forward_kl']:.4f}" if "test_forward_kl" in record else ""
        print(f"{name}: test perplexity {record['test_perplexity']:.2f}, {teacher_comparison(record, 'test')}{kl}")
    print(json.dumps(results))
    return 0
