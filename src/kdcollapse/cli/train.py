"""``kdcollapse train`` and ``kdcollapse distill``: one trainer, any method."""

from __future__ import annotations

import contextlib
import dataclasses
from typing import TYPE_CHECKING
import json
from pathlib import Path

from kdcollapse.errors import ConfigError

if TYPE_CHECKING:
    from kdcollapse.config import RunConfig

_TRAIN_EXAMPLES = """examples:
  kdcollapse train --config configs/fashion_mnist/teacher.yaml
  kdcollapse train --config configs/fashion_mnist/teacher.yaml train.epochs=5 optim.lr=0.1 run_dir=runs/t5
  kdcollapse train --config configs/fashion_mnist/teacher.yaml --seeds 0,1,2
  kdcollapse train --resume runs/fmnist_teacher            # continue exactly where it stopped
  torchrun --nproc_per_node=2 -m kdcollapse train --config configs/fashion_mnist/teacher.yaml
  kdcollapse --import mymodels train --config configs/fashion_mnist/student.yaml model.name=my_cnn
"""

_DISTILL_EXAMPLES = """examples:
  kdcollapse distill --config configs/fashion_mnist/dhkd.yaml
  kdcollapse distill --config configs/fashion_mnist/kd.yaml teacher.checkpoint=runs/fmnist_teacher
  kdcollapse distill --config configs/cifar100/dhkd/resnet32x4_resnet8x4.yaml --seeds 0,1,2
  kdcollapse distill --resume runs/fmnist_dhkd
"""


def register(subparsers) -> None:
    from kdcollapse.cli._common import HelpFormatter, add_quiet

    for name, examples, text in (
        ("train", _TRAIN_EXAMPLES, "Train a model (any method; teachers use method `vanilla`)."),
        ("distill", _DISTILL_EXAMPLES, "Distil a frozen teacher into a student (KD, DKD, DHKD, IKL-KD, ...)."),
    ):
        p = subparsers.add_parser(name, help=text, description=text, epilog=examples,
                                  formatter_class=HelpFormatter)
        p.add_argument("--config", metavar="FILE|RECIPE", help="YAML run config, or the name of a shipped recipe "
                       "(`kdcollapse recipes list`)")
        p.add_argument("overrides", nargs="*", metavar="key=value", help="dotted config overrides")
        p.add_argument("--resume", metavar="RUN_DIR", help="continue the run in RUN_DIR from its checkpoint")
        p.add_argument("--overwrite", action="store_true", help="replace a run already in run_dir")
        p.add_argument("--seeds", metavar="LIST", help="comma-separated seeds; runs go to run_dir/seed<N>")
        add_quiet(p, "per-epoch lines and no progress bar (train.progress=false)")
        p.set_defaults(func=_run, command_name=name)


def _run(args) -> int:
    from kdcollapse.distributed import distributed_teardown

    with distributed_teardown():  # leave the process group together, not each rank at its interpreter exit
        _train(args)
    return 0


def _train(args) -> None:
    from kdcollapse.distributed import is_main_process
    from kdcollapse.methods import get_method

    if args.resume and args.overwrite:
        raise ConfigError("--resume continues the run in RUN_DIR and --overwrite replaces it; give one of them")
    if args.resume and args.seeds is not None:
        raise ConfigError("--resume continues one run; resume each seed's directory (RUN_DIR/seed<N>) on its own")
    seeds = _parse_seeds(args.seeds) if args.seeds is not None else None
    if args.quiet:
        args.overrides = [*args.overrides, "train.progress=false"]
    cfg = _resolve_config(args)
    cfg.imports = list(dict.fromkeys([*cfg.imports, *getattr(args, "imports", [])]))  # saved: analyze sees them
    needs_teacher = get_method(cfg.method.name).teacher_request(cfg.method) is not None
    if args.command_name == "distill" and not needs_teacher:
        raise ConfigError(f"method '{cfg.method.name}' trains without a teacher; use `kdcollapse train`, or "
                          "set method.name to a distillation method (kd, dkd, dhkd, ikl_kd, ...)")
    report = is_main_process()  # under torchrun only rank 0 prints results
    if seeds is None:
        result = _fit(cfg, args)
        if report:
            _report(result)
        return
    # every seed's config and run directory is checked before the first run starts
    from kdcollapse.config import check_config  # the library loads when a command runs, not for --help
    from kdcollapse.runs import check_run_dirs

    runs = [check_config(dataclasses.replace(cfg, seed=seed, run_dir=str(Path(cfg.run_dir) / f"seed{seed}")))
            for seed in seeds]
    with _seeds_lock(Path(cfg.run_dir), report) as lock:  # one --seeds command per run_dir: one seeds.json writer
        check_run_dirs(runs, overwrite=args.overwrite, is_main=report)
        if lock is not None:
            lock.write_owner()
        results = []
        for run in runs:
            results.append(_fit(run, args))
            if report:
                _report(results[-1])
        if report:
            lock.check()  # still this command's directory: its seeds.json is the summary of its runs
            _summarise(Path(cfg.run_dir), seeds, results)


@contextlib.contextmanager
def _seeds_lock(run_dir: Path, is_main: bool):
    """Hold the lock of the folder of a ``--seeds`` command's runs (``run_dir/.lock``, on the main process) for
    the command, so that a second ``--seeds`` command into it is refused before it starts (CheckpointError
    naming the holder) instead of overwriting ``seeds.json`` with a summary of other runs. A command refused
    here, or by a later check before its first run, leaves the folder as it found it."""
    from kdcollapse.runs import RunLock, on_main_process

    created, held = not run_dir.exists(), []

    def take() -> None:
        run_dir.mkdir(parents=True, exist_ok=True)
        try:
            held.append(RunLock(run_dir, owner=False))
        except BaseException:
            if created:
                run_dir.rmdir()
            raise

    on_main_process(is_main, take, f"the main process could not lock {run_dir} for the --seeds runs")
    if not held:  # the other processes under torchrun
        yield None
        return
    lock = held[0]
    try:
        yield lock
    finally:
        refused = lock.created and lock.path.is_file() and lock.path.stat().st_size == 0  # before write_owner
        lock.release(undo=refused)
        if refused and created:
            with contextlib.suppress(OSError):
                run_dir.rmdir()


def _check_resume_overrides(overrides: list[str]) -> None:
    """Refuse, before any config is built, an override that a resume may not make (the saved config's
    method section, say, need not even be valid for another method)."""
    from kdcollapse.runs import RESUMABLE_KEYS

    refused = sorted({o.split("=", 1)[0].strip() for o in overrides} - set(RESUMABLE_KEYS))
    if refused:
        raise ConfigError(
            f"cannot resume: the run was trained with its own {', '.join(refused)}; a resume may change only "
            f"{', '.join(RESUMABLE_KEYS[1:])}; start a new run_dir for anything else"
        )


def _resolve_config(args) -> RunConfig:
    from kdcollapse.config import load_config

    if args.resume:
        if args.config:
            raise ConfigError("--resume takes its config from the run directory; drop --config")
        _check_resume_overrides(args.overrides)
        cfg = load_config(Path(args.resume) / "config.yaml", args.overrides, saved=True)
        cfg.run_dir = args.resume
        return cfg
    if not args.config:
        raise ConfigError("give --config FILE (see configs/) or --resume RUN_DIR")
    from kdcollapse.recipes import RECIPES_DIR, config_file

    path = config_file(args.config)
    if path.resolve().is_relative_to((RECIPES_DIR / "lm").resolve()):
        raise ConfigError(f"{args.config!r} is a language-model recipe: run it with "
                          f"`kdcollapse distill-lm --config {args.config}`")
    return load_config(path, args.overrides)


def _parse_seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise ConfigError(f"--seeds must be comma-separated integers, got {text!r}") from None
    if not seeds:
        raise ConfigError(f"--seeds is empty ({text!r}); give comma-separated integers such as 0,1,2")
    repeated = sorted({s for s in seeds if seeds.count(s) > 1})
    if repeated:
        raise ConfigError(f"--seeds {text}: seed {', '.join(map(str, repeated))} is given twice; each seed is one run")
    return seeds


def _fit(cfg: RunConfig, args):
    from kdcollapse.train import fit

    return fit(cfg, resume=bool(args.resume), overwrite=args.overwrite)


def _report(result) -> None:
    if result.selected_on == "val":
        best = (f"test accuracy {result.best_acc:.2f}% at the best validation accuracy "
                f"{result.best_val_acc:.2f}% (epoch {result.best_epoch})")
    else:
        best = f"best test accuracy {result.best_acc:.2f}% (epoch {result.best_epoch}, chosen on the test set)"
    print(f"{result.run_dir}: {best}, last {result.last_acc:.2f}% after {result.epochs} epochs")


def _summarise(run_dir: Path, seeds: list[int], results) -> None:
    import statistics  # loads decimal and fractions: kept out of `kdcollapse --help`

    from kdcollapse.runs import check_same_config, metrics_source, write_text

    check_same_config([r.run_dir for r in results])
    best = [r.best_acc for r in results]
    last = [r.last_acc for r in results]

    def fmt(values):
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.2f} ± {spread:.2f}"

    run_dir.mkdir(parents=True, exist_ok=True)
    summary = {"seeds": seeds, "best_acc": best, "last_acc": last,
               "best_mean_std": fmt(best), "last_mean_std": fmt(last),
               "runs": [metrics_source(r.run_dir) for r in results]}  # what each number was read from
    write_text(run_dir / "seeds.json", json.dumps(summary, indent=2) + "\n")
    print(f"{len(seeds)} seeds: best {fmt(best)}%, last {fmt(last)}% (mean ± std) -> {run_dir / 'seeds.json'}")
