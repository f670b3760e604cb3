"""``kdcollapse analyze`` (collapse report of one model on one split) and ``kdcollapse plot`` (curves)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


from kdcollapse._yaml import load_yaml
from kdcollapse.cli._common import (FIGURE_SUFFIXES, HelpFormatter, check_output, non_negative_float,
                                   non_negative_int, positive_int)
from kdcollapse.errors import ConfigError, KdcollapseError

_ANALYZE_EXAMPLES = """examples:
  kdcollapse analyze runs/fmnist_teacher                        # test split -> runs/fmnist_teacher/analysis_test/
  kdcollapse analyze runs/fmnist_teacher --split train --per-class 1000
  kdcollapse analyze runs/fmnist_teacher --tsne-per-class 200 --precision bf16 --channels-last
  kdcollapse analyze runs/fmnist_dhkd --teacher runs/fmnist_teacher --out /tmp/dhkd_test
  kdcollapse analyze runs/fmnist_teacher --ood mnist               # NC5 against another data set's features
  kdcollapse analyze --model convnet --weights model.safetensors --data fashion_mnist --out /tmp/a
  kdcollapse analyze --model mlp --model-kwargs '{input_size: 8}' --weights w.safetensors --data digits --out a
  kdcollapse analyze --lm smollm2-135m --layers all --max-tokens 4096 --out results/lm_collapse/smollm2_test_4k
  kdcollapse analyze --lm runs/lm/study/fkl_s0/student --random-init 0 --layers all --out /tmp/untrained
  kdcollapse analyze --lm runs/lm/study/fkl_s0/student --against smollm2-135m --layers all --out /tmp/vs_teacher

output (analysis.md lists every metric with its meaning; logit_matrices.png only with a teacher):
  $ kdcollapse analyze runs/fmnist_teacher --per-class 500 --out /tmp/t
  runs/fmnist_teacher (test): accuracy 93.16 %, nc1 0.3983, vci 0.1745, ncc_accuracy 0.922 -> /tmp/t/analysis.md
  $ ls /tmp/t
  analysis.json  analysis.md  margins.png  spectra.png            # tsne.png too with --tsne-per-class N
"""

_PLOT_EXAMPLES = """examples:
  kdcollapse plot runs/fmnist_kd runs/fmnist_dhkd --keys test_acc,train_vci,test_vci --out curves.png
  kdcollapse plot runs/a runs/b --labels KD,DHKD --keys train_nc1,test_nc1,train_ncc_accuracy --out ab.png
  kdcollapse plot runs/fmnist_teacher      # -> runs/fmnist_teacher/curves.png: test_acc, train_loss, collapse keys
  kdcollapse plot runs/fmnist_teacher --table --keys train_acc,test_acc --epochs 1,5,10-15   # markdown, stdout
"""

_NO_DEFAULT = "%(default).0s"  # the help says the default in words; keeps "(default: None)" out

# analyze's options that only --lm reads, with their defaults: given for an image run, they are refused.
LM_ONLY = {"corpus": None, "layers": "last", "block_size": 256, "max_tokens": None, "min_count": 2,
           "gnc_convention": "paper", "no_ncc": False, "accumulate": "auto", "random_init": None,
           "ncc_cache_gib": 2.0}

_DEFAULT_KEYS = ("test_acc", "train_loss", "train_nc1", "test_nc1", "train_vci", "test_vci")


def register(subparsers) -> None:
    from kdcollapse.analysis import AnalyzeOptions  # loads analysis/_options.py alone (a lazy face)
    text = "Collapse metrics, margins, spectra, t-SNE and logit matrices of a trained model on one split."
    p = subparsers.add_parser("analyze", help=text, description=text + " One streaming pass over the data.",
                              epilog=_ANALYZE_EXAMPLES, formatter_class=HelpFormatter)
    add = _adder(p)
    add("run_dir", nargs="?", metavar="RUN_DIR", help="a `kdcollapse train`/`distill` run directory")
    p.add_argument("--split", default="test", help="train, val (a run's validation split) or test")
    add("--out", metavar="DIR", help="output directory (default: RUN_DIR/analysis_<split>)")
    add("--per-class", type=positive_int, metavar="N",
        help="analyse N samples per class (drawn with the run's seed, as analysis.train_per_class)")
    add("--ood", metavar="NAME", help="out-of-distribution dataset for NC5 (nc5_ood_deviation; same input shape)")
    p.add_argument("--ood-split", default="test", help="split of the --ood dataset")
    add("--ood-classes", metavar="LIST", help="only these classes of the --ood dataset (comma-separated indices)")
    add("--against", metavar="TEACHER_RUN_OR_FILE",
        help="compare RUN_DIR's geometry with this teacher's on the same data (Procrustes, CKA, simplex angles) "
             "-> against_<split>/against.{json,md}; with --lm: a teacher language model (same vocabulary), "
             "each --layers hidden state against the teacher's at its relative depth -> OUT/against.{json,md}")
    add("--kept-layers", metavar="LIST",
        help="with --lm --against: the student is made of these teacher decoder layers (0-based, comma-separated; "
             "'run': the student_layers of the distill-lm run whose student/ --lm names): each student state against "
             "the teacher's after the same layer, not at its relative depth")
    add("--stages", metavar="LIST",
        help="also every stage's pooled map: 'all' or comma-separated stage indices (with --lm: --layers)")
    add("--teacher", metavar="RUN_DIR_OR_FILE",
        help="teacher for the logit matrices (default: the run's own teacher, if any)")
    group = _adder(p.add_argument_group("a model file instead of a run directory"))
    group("--model", metavar="NAME", help="registered model name (`kdcollapse models`)")
    group("--weights", metavar="FILE", help="safetensors weights of that model")
    group("--model-kwargs", metavar="YAML", help="model options of a bare weights file")
    group("--data", metavar="NAME", help="dataset name (`kdcollapse data list`)")
    group("--root", metavar="DIR", help="dataset folder (default: search the standard places)")
    defaults = AnalyzeOptions()
    add("--batch-size", type=positive_int, metavar="B", help="batch size (default: the run's data.eval_batch_size, else 512)")
    p.add_argument("--sample-size", type=positive_int, default=defaults.sample_size,
                   help="feature rows kept for t-SNE and nearest-class-mean, about evenly per class")
    add("--tsne-classes", metavar="LIST", help="comma-separated class indices (default: the first 10)")
    p.add_argument("--tsne-per-class", type=non_negative_int, default=defaults.tsne_per_class,
                   help="t-SNE points per class (200 is a good figure); 0: no t-SNE, which costs more than the pass")
    p.add_argument("--precision", choices=("off", "auto", "bf16", "fp16"), default=defaults.precision,
                   help="autocast of the forward pass (bf16 on CPU or GPU, fp16 on GPU; auto: bf16 where the device "
                        "computes it natively, else off); metrics stay float64")
    p.add_argument("--channels-last", action="store_true", help="channels-last layout for image models")
    add("--seed", type=non_negative_int, help="seed of the feature sample and t-SNE (default: the run's seed, else 0)")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda or cuda:N")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    lm = _adder(p.add_argument_group("a causal language model: next-token classes (docs/analysis.md)"))
    lm("--lm", metavar="SOURCE", help="smollm2-135m, a GGUF file or a Hugging Face directory (kdcollapse.lm)")
    lm("--corpus", metavar="ROOT", help="text corpus folder (default: python-docs); --split picks its split")
    p.add_argument("--layers", default="last", help="last, all, or comma-separated hidden-state indices (0 = embeddings)")
    p.add_argument("--block-size", type=int, default=256, help="tokens per row")
    lm("--max-tokens", type=int, metavar="N", help="analyse the first N tokens of the split (default: all)")
    p.add_argument("--min-count", type=int, default=2, help="classes (next tokens) seen fewer times are excluded")
    p.add_argument("--gnc-convention", choices=("paper", "official"), default="paper",
                   help="GNC1/GNC3 centring: the paper's formulas or the official code's (docs/metrics.md)")
    p.add_argument("--no-ncc", action="store_true", help="skip NC4 (nearest class means) over the tokens")
    p.add_argument("--ncc-cache-gib", type=non_negative_float, default=2.0, metavar="GIB",
                   help="memory for NC4's hidden states kept from the statistics pass; over it (or 0), NC4 runs "
                        "the model a second time (same answers)")
    p.add_argument("--accumulate", choices=("auto", "float64", "float32"), default="auto",
                   help="dtype of the K x d class sums of every layer (auto: float32 once float64 would pass 4 GiB)")
    lm("--random-init", type=non_negative_int, metavar="SEED",
       help="the --lm model's architecture and tokenizer with freshly initialised weights (seed SEED): the "
            "untrained control")
    p.set_defaults(func=_analyze)

    text = "Plot metric and accuracy curves from metrics.jsonl of one or more runs on one figure."
    p = subparsers.add_parser("plot", help=text, description=text, epilog=_PLOT_EXAMPLES,
                              formatter_class=HelpFormatter)
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR")
    add = _adder(p)
    add("--keys", metavar="LIST",
        help=f"comma-separated metrics.jsonl keys (default: those of {','.join(_DEFAULT_KEYS)} that the runs log)")
    add("--labels", metavar="LIST", help="comma-separated legend labels, one per run")
    add("--out", metavar="FILE", help="figure file to write (default: RUN_DIR/curves.png for one run; required for "
        "several)")
    add("--title", help="figure title")
    p.add_argument("--table", action="store_true",
                   help="print one run's per-epoch table (markdown) of --keys instead of drawing a figure")
    add("--epochs", metavar="LIST", help="--table: the epochs, e.g. 1,5,10-15 (default: every logged epoch)")
    add("--digits", metavar="LIST", help="--table: decimals, one number or one per key (default: 2)")
    add("--headers", metavar="LIST", help="--table: comma-separated column headers, one per key (default: the keys)")
    p.set_defaults(func=_plot)

    text = ("Tables, comparisons, rank correlations and the figure of a page of next-token collapse across "
            "language models, from their `analyze --lm` outputs (a YAML spec beside the page).")
    p = subparsers.add_parser("token-report", help=text, description=text, formatter_class=HelpFormatter,
                              epilog="example:\n  kdcollapse token-report results/lm_collapse/distilled.yaml\n"
                                     "  kdcollapse token-report --check results/lm_collapse/distilled.yaml")
    p.add_argument("spec", metavar="FILE", help="the page's YAML file (kdcollapse.analysis.token_report)")
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if the page or summary.json is stale")
    p.set_defaults(func=_token_report)


def _token_report(args: argparse.Namespace) -> int:
    from kdcollapse.analysis import token_report

    changed = token_report(args.spec, check=args.check)
    for path in changed:
        print(f"{'stale' if args.check else 'wrote'}: {path}")
    if not changed:
        print("up to date")
    return 1 if args.check and changed else 0


def _adder(parser):
    """``add_argument`` for options whose help states the default in words (no "(default: None)")."""

    def add(*names, help: str, **kwargs):
        return parser.add_argument(*names, help=help + _NO_DEFAULT, **kwargs)

    return add


def _device(name: str):
    from kdcollapse.distributed import resolve_device

    return resolve_device(name, option="--device")


def _int_list(text: str | None, what: str) -> list[int] | None:
    if text is None:
        return None
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise ConfigError(f"{what} must be comma-separated integers, got {text!r}") from None


def _analyze(args: argparse.Namespace) -> int:
    from kdcollapse.analysis import AnalyzeOptions, analyze, load_run, load_weights, parse_stages
    from kdcollapse.config import load_config

    device = _device(args.device)
    if args.out:
        check_output(args.out, "--out", folder=True)
    if args.lm:
        if args.ood is not None:
            raise ConfigError("--ood takes image runs; it does not apply to --lm")
        if args.stages is not None:  # a language model's stages are its hidden states
            if args.layers != "last":
                raise ConfigError("give --stages or --layers with --lm, not both")
            args.layers = args.stages
        return _analyze_lm(args, device)
    given = [f"--{k.replace('_', '-')}" for k, default in LM_ONLY.items() if getattr(args, k) != default]
    if given:
        raise ConfigError(f"{', '.join(given)} apply only to a language model (--lm SOURCE), not to an image "
                          "run or weights file; drop them, or give --lm")
    file_mode = [args.model, args.weights, args.data]
    if args.run_dir and any(file_mode):
        raise ConfigError("give either RUN_DIR or --model/--weights/--data, not both")
    if args.against is not None:
        return _against(args, device)
    if args.run_dir:
        subject = load_run(args.run_dir, args.split, device=device, per_class=args.per_class, teacher=args.teacher)
        cfg = load_config(Path(args.run_dir) / "config.yaml", saved=True)
        batch_size, seed = cfg.data.eval_batch_size, cfg.seed
        out = Path(args.out) if args.out else check_output(Path(args.run_dir) / f"analysis_{args.split}", "the output",
                                                           folder=True)
    elif all(file_mode):
        if not args.out:
            raise ConfigError("--out DIR is required when analysing a weights file")
        seed = args.seed or 0
        subject = load_weights(args.model, args.weights, args.data, args.split, device=device, root=args.root,
                               model_kwargs=_yaml_mapping(args.model_kwargs), per_class=args.per_class, seed=seed,
                               teacher=args.teacher)
        batch_size, out = 512, Path(args.out)
    else:
        raise ConfigError("give a RUN_DIR, or all of --model NAME --weights FILE --data NAME")
    options = AnalyzeOptions(
        batch_size=args.batch_size or batch_size, sample_size=args.sample_size,
        tsne_classes=_int_list(args.tsne_classes, "--tsne-classes"), tsne_per_class=args.tsne_per_class,
        seed=seed if args.seed is None else args.seed, progress=not args.no_progress,
        precision=args.precision, channels_last=args.channels_last, stages=parse_stages(args.stages),
    )  # fmt: skip
    report = analyze(subject, out, options, ood=_ood(args))
    m = report["metrics"]
    print(f"{report.get('run_dir') or report.get('weights')} ({args.split}): accuracy {100 * m['accuracy']:.2f} %, "
          f"nc1 {m['nc1']:.4g}, vci {m['vci']:.4g}, ncc_accuracy {m['ncc_accuracy']:.4g} -> {out / 'analysis.md'}")
    return 0


def _against(args: argparse.Namespace, device) -> int:
    """``analyze STUDENT_RUN --against TEACHER``: the two models' geometry on the student's split."""
    from kdcollapse.analysis import AnalyzeOptions, analyze_against, load_run, parse_stages
    from kdcollapse.config import load_config
    from kdcollapse.runs import load_model

    if not args.run_dir or args.model or args.weights or args.data or args.ood:
        raise ConfigError("--against needs a student RUN_DIR (and takes no --model/--weights/--data/--ood)")
    stages = parse_stages(args.stages)
    subject = load_run(args.run_dir, args.split, device=device, per_class=args.per_class)
    teacher = load_model(args.against, device, dataset=subject.dataset)[0]
    cfg = load_config(Path(args.run_dir) / "config.yaml")
    out = Path(args.out) if args.out else check_output(Path(args.run_dir) / f"against_{args.split}", "the output",
                                                       folder=True)
    options = AnalyzeOptions(batch_size=args.batch_size or cfg.data.eval_batch_size, progress=not args.no_progress,
                             precision=args.precision)
    report = analyze_against(subject, teacher, out, options, stages=stages, teacher_info=str(args.against))
    m = report["layers"]["features"]
    print(f"{args.run_dir} vs {args.against} ({args.split}): procrustes_alignment {m['procrustes_alignment']:.4g}, "
          f"feature_cka {m['feature_cka']:.4g}, agreement {report['agreement']:.4g} -> {out / 'against.md'}")
    return 0


def _ood(args: argparse.Namespace):
    """The ``--ood`` dataset (``--ood-split``, ``--ood-classes``), or None."""
    if args.ood is None:
        if args.ood_classes is not None:
            raise ConfigError("--ood-classes needs --ood NAME")
        return None
    from kdcollapse.data import load_dataset

    data = load_dataset(args.ood, args.ood_split)
    classes = _int_list(args.ood_classes, "--ood-classes")
    return data if classes is None else data.select_classes(classes)


def _analyze_lm(args: argparse.Namespace, device) -> int:
    from kdcollapse.analysis import analyze_tokens, token_batches
    from kdcollapse.lm import leading_specials, load_language_model, tokenize_corpus
    from kdcollapse.runs import lm_source, record_outputs, run_lock_for

    if not args.out:
        raise ConfigError("--out DIR is required with --lm")
    if args.run_dir or args.model or args.weights or args.data:
        raise ConfigError("--lm analyses a language model: give no RUN_DIR, --model, --weights or --data")
    layers = args.layers if args.layers in ("last", "all") else _int_list(args.layers, "--layers")
    if args.kept_layers is not None and args.against is None:
        raise ConfigError("--kept-layers pairs a student's layers with its teacher's: it needs --against")
    kept = None if args.kept_layers is None else _kept_layers(args.kept_layers, args.lm)
    if args.against is not None and (args.no_ncc or args.gnc_convention != "paper" or args.ncc_cache_gib != 2.0):
        raise ConfigError("--against with --lm takes no --no-ncc, --ncc-cache-gib or --gnc-convention (it runs no "
                          "NC4 and no GNC metric)")
    loaded = load_language_model(args.lm, pretrained=args.random_init is None, seed=args.random_init)
    source = args.lm if args.random_init is None else f"{args.lm} (random initialisation, seed {args.random_init})"
    corpus = tokenize_corpus(loaded.tokenizer, args.corpus)
    split = "validation" if args.split == "val" else args.split
    blocks = corpus[split].blocks(args.block_size, leading_specials(loaded.tokenizer))  # a BOS where the model takes one
    batches = token_batches(blocks, args.batch_size or 8, args.max_tokens)
    if args.against is not None:
        return _against_lm(args, device, loaded.model, batches, layers, split, source, kept)
    with run_lock_for(args.out) as run_dir:  # a report written into a run directory: never beside its trainer
        result = analyze_tokens(loaded.model.to(device), batches, layers=layers, min_count=args.min_count,
                                ncc=not args.no_ncc, gnc_convention=args.gnc_convention, out_dir=args.out,
                                accumulate=args.accumulate, progress=not args.no_progress, source=source,
                                ncc_cache_bytes=int(args.ncc_cache_gib * 2**30))
        if run_dir is not None:  # listed in the run's outputs.json: --overwrite removes it, stale_outputs checks it
            written = [Path(args.out) / n for n in ("analysis.json", "token_counts.json", "analysis.md", "layers.png")]
            record_outputs(run_dir, [p for p in written if p.is_file()], lm_source(args.lm, run_dir, args.random_init))
    c, last = result["classes"], result["layers"][max(result["layers"])]
    if (cache := result["ncc_features"]) is not None and cache["bytes_needed"] > cache["budget_bytes"]:
        print(f"NC4 ran the model a second time: its features would take {cache['bytes_needed'] / 2**30:.2f} GiB, "
              f"over --ncc-cache-gib {args.ncc_cache_gib:g}")
    print(f"{source} ({split}, {c['tokens']} tokens, {c['classes_kept']} classes): last layer nc1 "
          f"{last['nc1']:.4g}, cdnv {last['cdnv']:.4g}, vci {last['vci']:.4g} -> {Path(args.out) / 'analysis.md'}")
    return 0


def _kept_layers(text: str, lm: str) -> list[int]:
    """``--kept-layers``: a comma-separated list, or ``run``: the ``student_layers`` of the run whose ``student/``
    ``lm`` is (its ``run.json``)."""
    if text != "run":
        return _int_list(text, "--kept-layers")
    record = Path(lm).parent / "run.json"
    try:
        kept = json.loads(record.read_text()).get("student_layers")
    except (OSError, ValueError):
        kept = None
    if not isinstance(kept, list):
        raise ConfigError(f"--kept-layers run: {record} names no student_layers (a distill-lm run whose student was "
                          "made of its teacher's layers writes them); give the layers as a list")
    return kept


def _against_lm(args: argparse.Namespace, device, student, batches, layers, split: str, source: str,
                kept: list[int] | None = None) -> int:
    """``analyze --lm STUDENT --against TEACHER``: both language models on the same token batches (the
    student's tokenizer; the teacher must share its vocabulary)."""
    from kdcollapse.analysis import analyze_tokens_against
    from kdcollapse.lm import load_language_model
    from kdcollapse.runs import lm_source, record_outputs, run_lock_for

    teacher = load_language_model(args.against).model
    with run_lock_for(args.out) as run_dir:
        result = analyze_tokens_against(student.to(device), teacher.to(device), batches, layers=layers,
                                        min_count=args.min_count, accumulate=args.accumulate, out_dir=args.out,
                                        progress=not args.no_progress, source=source, teacher_source=args.against,
                                        kept=kept)
        if run_dir is not None:
            written = [Path(args.out) / n for n in ("against.json", "against.md")]
            record_outputs(run_dir, written, lm_source(args.lm, run_dir, args.random_init))
    name, last = max(result["layers"].items(), key=lambda item: int(item[0].split("/")[0]))
    print(f"{source} vs {args.against} ({split}, {result['positions']} positions): layer {name} "
          f"procrustes_alignment {last['procrustes_alignment']:.4g}, feature_cka {last['feature_cka']:.4g}, "
          f"agreement {result['agreement']:.4g} -> {Path(args.out) / 'against.md'}")
    return 0


def _yaml_mapping(text: str | None) -> dict:
    if not text:
        return {}
    value = load_yaml(text, f"--model-kwargs {text!r}")
    if not isinstance(value, dict):
        raise ConfigError(f"--model-kwargs must be a mapping such as '{{input_size: 8}}', got {text!r}")
    return value


def _plot(args: argparse.Namespace) -> int:
    from kdcollapse._optional import require
    from kdcollapse.report import plot_curves
    from kdcollapse.runs import Run, metrics_source, record_outputs, run_lock_for, save_figure

    if args.table or args.epochs or args.digits or args.headers:
        return _epoch_table(args)
    require("matplotlib", "kdcollapse plot")  # before reading any run
    if args.out is None:  # never into the current folder unasked
        if len(args.run_dirs) > 1:
            raise ConfigError(f"plotting {len(args.run_dirs)} runs needs --out FILE (e.g. --out curves.png); one "
                              "run's figure goes to RUN_DIR/curves.png")
        args.out = str(Path(args.run_dirs[0]) / "curves.png")
    check_output(args.out, "--out", suffixes=FIGURE_SUFFIXES)

    runs = {}
    labels = args.labels.split(",") if args.labels else _labels([Path(d) for d in args.run_dirs])
    if len(labels) != len(args.run_dirs):
        raise ConfigError(f"--labels gives {len(labels)} labels for {len(args.run_dirs)} runs")
    for label, run_dir in zip(labels, args.run_dirs):
        if not Path(run_dir).is_dir():
            raise KdcollapseError(f"run directory not found: {run_dir}")
        records = Run(run_dir).metrics()  # up to the last committed epoch
        if not records:
            raise KdcollapseError(f"{run_dir} holds no metrics.jsonl records; is it a `kdcollapse train` run?")
        runs[label] = records
    logged = sorted({k for records in runs.values() for r in records for k in r} - {"epoch"})
    keys = args.keys.split(",") if args.keys else [k for k in _DEFAULT_KEYS if k in logged]
    missing = [k for k in keys if k not in logged]
    if missing or not keys:
        raise KdcollapseError(f"no run logs the key(s) {', '.join(missing) or '(none given)'}. "
                              f"Logged keys: {', '.join(logged)}")
    source = {"runs": [metrics_source(d) for d in args.run_dirs], "keys": keys}  # recorded in the figure
    with run_lock_for(args.out) as run_dir:  # a figure written into a run directory: never beside its trainer
        path = plot_curves(runs, keys, args.out, title=args.title,
                           save=lambda fig, out, **kw: save_figure(fig, out, source, **kw))
        if run_dir is not None:  # listed in the run's outputs.json: --overwrite removes it
            record_outputs(run_dir, [path], source)
    print(f"{len(runs)} run(s), {len(keys)} panel(s) -> {path}")
    return 0


def _epoch_table(args: argparse.Namespace) -> int:
    """``plot --table``: one run's per-epoch markdown table on stdout; writes nothing."""
    from kdcollapse.report import epoch_table, parse_epochs
    from kdcollapse.runs import Run

    if not args.table:
        raise ConfigError("--epochs, --digits and --headers shape a --table; add --table")
    if len(args.run_dirs) != 1 or args.keys is None:
        raise ConfigError(f"--table prints one run's table of --keys: got {len(args.run_dirs)} runs and keys "
                          f"{args.keys!r}")
    if not Path(args.run_dirs[0]).is_dir():
        raise KdcollapseError(f"run directory not found: {args.run_dirs[0]}")
    rows = Run(args.run_dirs[0]).metrics()  # up to the last committed epoch
    keys = args.keys.split(",")
    digits = _int_list(args.digits, "--digits") or [2]
    print(epoch_table(rows, keys, parse_epochs(args.epochs) if args.epochs else None,
                      digits[0] if len(digits) == 1 else digits, args.headers.split(",") if args.headers else None),
          end="")
    return 0


def _labels(paths: list[Path]) -> list[str]:
    """The shortest path suffixes that tell the runs apart (``kd/seed0`` and ``dhkd/seed0``)."""
    parts = [p.resolve().parts for p in paths]
    for depth in range(1, max(len(p) for p in parts) + 1):
        labels = ["/".join(p[-depth:]) for p in parts]
        if len(set(labels)) == len(labels):
            return labels
    return [str(p) for p in paths]
