"""``kdcollapse study run | status | report FILE``: a study file's runs, where they stand, and its page."""

from __future__ import annotations

_EXAMPLES = """examples:
  kdcollapse study run results/distillation/dkd_beta/study.yaml --workers 2        # here, 2 runs at a time
  kdcollapse study run study.yaml --executor slurm --partition gpu                 # job arrays on SLURM
  kdcollapse study status results/distillation/dkd_beta/study.yaml
  kdcollapse study report results/distillation/dkd_beta/study.yaml                 # tables and verdicts
  kdcollapse study report --check results/*/*/study.yaml                           # pages up to date?

A finished run (its last epoch committed) is skipped, an interrupted one resumed; a run that another
process is training (its run directory's lock) is left to it. One launch of a study at a time: a second
`study run` of the same file is refused. See docs/studies.md for the file format.
"""


def register(subparsers) -> None:
    from kdcollapse.cli._common import HelpFormatter, positive_int

    text = "Run a study file's grid of runs (here or on SLURM), show where it stands, write its page."
    p = subparsers.add_parser("study", help=text, description=text, epilog=_EXAMPLES, formatter_class=HelpFormatter)
    sub = p.add_subparsers(dest="study_command", metavar="ACTION", required=True)
    run = sub.add_parser("run", help="train every run not finished, then the post steps and the report",
                         formatter_class=HelpFormatter)
    run.add_argument("file", metavar="FILE")
    run.add_argument("--executor", choices=("local", "slurm"), default="local")
    run.add_argument("--workers", type=positive_int, metavar="N",
                     help="local: runs at a time (default: 1); slurm: at most N jobs of each array at a time (default: 64)")
    run.add_argument("--threads", type=positive_int, default=1, metavar="N", help="torch threads per run")
    run.add_argument("--partition", help="slurm: the partition (else each group's resources.partition)")
    run.add_argument("--no-wait", action="store_true", help="slurm: return once the jobs are submitted")
    run.add_argument("--only", nargs="+", metavar="GLOB", help="only the runs whose name matches one of these")
    st = sub.add_parser("status", help="each run's state: new, interrupted, running, finished, diverged; and each "
                        "choice of a 'choose' group still waiting for its runs",
                        formatter_class=HelpFormatter)
    st.add_argument("file", metavar="FILE")
    rep = sub.add_parser("report", help="collect the finished runs' records and write the page's tables",
                         formatter_class=HelpFormatter)
    rep.add_argument("files", metavar="FILE", nargs="+")
    rep.add_argument("--check", action="store_true", help="write nothing; exit 1 if a page is not up to date")
    for q in (run, st, rep):
        q.add_argument("--runs-dir", metavar="DIR", help="where the runs live (default: the file's runs_dir)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    return {"run": _study_run, "status": _status, "report": _report}[args.study_command](args)


def _study_run(args) -> int:
    import fnmatch

    from kdcollapse.errors import ConfigError, unknown_choice
    from kdcollapse.study import launch_lock, load_study

    study = load_study(args.file, args.runs_dir)  # the whole file checked before the lock or any run
    if args.only and not any(fnmatch.fnmatchcase(n, g) for n in study.runs for g in args.only):
        raise ConfigError(unknown_choice("run of --only (a glob that matches none)", " ".join(args.only), study.runs))
    with launch_lock(args.file):  # one launch of a study at a time
        return _launch(args)


def _launch(args) -> int:
    import fnmatch
    from pathlib import Path

    from kdcollapse.study import load_study, pending, run_local, submit_slurm, write_page

    outcomes, tried = [], set()
    while True:  # again after each round: a group that chooses on earlier runs resolves once they finished
        study = load_study(args.file, args.runs_dir)
        names = [n for n in study.runs if not args.only or any(fnmatch.fnmatchcase(n, g) for g in args.only)]
        left = pending(study, names)
        todo = [r for r in left if r.name not in tried]
        if tried and not todo:
            break
        tried |= {r.name for r in todo}
        print(f"{study.name}: {len(names)} runs, {len(names) - len(left)} finished, {len(todo)} to do"
              + (f", {len(study.waiting)} choices waiting" if study.waiting else ""))
        if not todo:
            break
        if args.executor == "slurm":
            jobs = submit_slurm(study, todo, Path(study.runs_dir) / "_submitit", partition=args.partition,
                                threads=args.threads, parallel=args.workers or 64)
            print(f"submitted {len(jobs)} jobs: arrays "
                  f"{', '.join(sorted({j.job_id.split('_')[0] for j in jobs}, key=int))}")
            if args.no_wait:
                _print_waiting(study)
                return 0
            done = [job.result() for job in jobs]
            for o in done:
                print(f"{o.name}: {o.status}{' — ' + o.message if o.message else ''}")
        else:
            done = run_local(study, todo, workers=args.workers or 1, threads=args.threads,
                             report=lambda o: print(f"{o.name}: {o.status}{' — ' + o.message if o.message else ''}",
                                                    flush=True))
        outcomes += done
    _print_waiting(study)
    if study.summary and not args.only:
        for path in write_page(study):
            print(f"wrote {path}")
    return 0 if all(o.status in ("finished", "diverged") for o in outcomes) else 1  # a divergence is a result


def _status(args) -> int:
    from collections import Counter

    from kdcollapse.study import load_study, status

    study = load_study(args.file, args.runs_dir)
    states = status(study)
    for name, state in states.items():
        print(f"{state:12s} {name}")
    _print_waiting(study)
    print(", ".join(f"{n} {s}" for s, n in Counter(states.values()).items())
          + (f", {len(study.waiting)} choices waiting" if study.waiting else ""))
    return 0


def _print_waiting(study) -> None:
    """One line per choice of a ``choose`` group not made yet (its runs are not in the study until it is)."""
    for group, where, source, missing in study.waiting:
        of = ", ".join(f"{k}={v}" for k, v in where.items()) or "its setting"
        print(f"{'waiting':12s} group {group} ({of}): " + (
            f"chosen on validation once {len(missing)} run(s) of group {source} finish: {', '.join(missing)}"
            if missing else f"no choice: no run of group {source} has a validation value on a shared seed"))


def _report(args) -> int:
    from kdcollapse.study import load_study, write_page

    stale = []
    for file in args.files:
        changed = write_page(load_study(file, args.runs_dir), check=args.check)
        stale += changed
        for path in changed:
            print(f"{'out of date' if args.check else 'wrote'}: {path}")
    return 1 if args.check and stale else 0
