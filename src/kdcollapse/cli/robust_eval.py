"""``kdcollapse robust-eval``: clean and robust accuracy of a trained run (AutoAttack standard, PGD-k)."""

from __future__ import annotations

_EXAMPLES = """examples:
  kdcollapse robust-eval runs/cifar10_ikl_at --eps 8/255                   # AutoAttack standard + PGD-20, all test images
  kdcollapse robust-eval runs/fmnist_trades --eps 0.1 --attacks pgd        # PGD-20 only (quick upper bound)
  kdcollapse robust-eval runs/fmnist_trades --eps 0.1 --attacks standard --n-examples 500
  kdcollapse robust-eval runs/cifar10_ikl_at --norm L2 --eps 0.5 --weights best

Results go to RUN_DIR/robust_eval.json (one entry per attack, norm, eps and weights; re-running an
evaluation replaces its entry) and RUN_DIR/robust_eval.md. --aa-iterations/--aa-targets/--aa-queries
below the standard's 100/9/5000 give a cheaper chain reported as "autoattack-reduced", not as
AutoAttack standard.
"""


# What --help shows, without importing the attacks (tests/test_cli_startup.py checks these against
# kdcollapse.adversarial and kdcollapse.experiments.robust_eval).
NORMS = ("Linf", "L2")
ATTACKS = ("pgd", "standard")
DEFAULT_ATTACKS = ("standard", "pgd")
WEIGHTS = ("last", "best")
STANDARD_BUDGET = {"n_iter": 100, "n_targets": 9, "n_queries": 5000}


def register(subparsers) -> None:
    from kdcollapse.cli._common import HelpFormatter, non_negative_int, positive_int

    text = "Clean and robust accuracy of a trained run under AutoAttack (standard) and PGD-k."
    p = subparsers.add_parser("robust-eval", help=text, description=text, epilog=_EXAMPLES,
                              formatter_class=HelpFormatter)
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory of `kdcollapse train`")
    p.add_argument("--norm", choices=NORMS, default="Linf", help="threat model")
    p.add_argument("--eps", default="8/255", help="radius in [0, 1] pixel units: a number or a fraction")
    p.add_argument("--n-examples", type=positive_int, metavar="N", help="evaluate the first N test images; all of them without it")
    p.add_argument("--batch-size", type=positive_int, default=500, metavar="B")
    p.add_argument("--attacks", default=",".join(DEFAULT_ATTACKS), metavar="LIST",
                   help=f"comma-separated, from: {', '.join(ATTACKS)} (standard = AutoAttack)")
    p.add_argument("--pgd-steps", type=positive_int, default=20, metavar="K", help="steps of PGD-k (step 2.5·eps/K)")
    p.add_argument("--weights", choices=WEIGHTS, default="last",
                   help="model.safetensors (last epoch) or best.safetensors")
    p.add_argument("--seed", type=non_negative_int, default=0, help="seeds the attacks' random starts and searches")
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N")
    p.add_argument("--data-root", metavar="DIR", help="dataset folder; without it the run's data.root, then "
                   "the default search paths")
    p.add_argument("--aa-iterations", type=positive_int, default=STANDARD_BUDGET["n_iter"], metavar="N",
                   help="APGD/FAB iterations")
    p.add_argument("--aa-targets", type=positive_int, default=STANDARD_BUDGET["n_targets"], metavar="N",
                   help="target classes of APGD-T/FAB-T")
    p.add_argument("--aa-queries", type=positive_int, default=STANDARD_BUDGET["n_queries"], metavar="N",
                   help="Square queries")
    p.add_argument("--precision", choices=("off", "auto", "bf16", "fp16"), default="off",
                   help="autocast precision of the attacks' search (bf16 on CPU or CUDA, fp16 on CUDA; auto: bf16 where native); "
                        "whether an input fools the model is always decided in float32")
    p.add_argument("--channels-last", action="store_true", help="channels-last layout for the search")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=_run)


def _run(args) -> int:
    from kdcollapse.distributed import resolve_device
    from kdcollapse.experiments.robust_eval import RESULT_JSON, RESULT_MD, evaluate_run

    device = resolve_device(args.device, option="--device")
    attacks = [a.strip() for a in args.attacks.split(",") if a.strip()]
    entries = evaluate_run(
        args.run_dir, norm=args.norm, eps=args.eps, attacks=attacks, n_examples=args.n_examples,
        batch_size=args.batch_size, pgd_steps=args.pgd_steps, weights=args.weights, seed=args.seed,
        device=device, data_root=args.data_root, progress=not args.no_progress, precision=args.precision,
        channels_last=args.channels_last,
        aa_budget={"n_iter": args.aa_iterations, "n_targets": args.aa_targets, "n_queries": args.aa_queries},
    )
    for key, e in entries.items():
        print(f"\n{key}: {e['examples']} of {e['dataset']} ({e['model']}, method {e['method']}, {e['model_file']})")
        print(f"clean accuracy {e['clean_accuracy']:.2%}, robust accuracy {e['robust_accuracy']:.2%} "
              f"({e['total_seconds']:.1f} s)")
        print(e["table"])
    print(f"\nwrote {args.run_dir}/{RESULT_JSON} and {args.run_dir}/{RESULT_MD}")
    return 0
