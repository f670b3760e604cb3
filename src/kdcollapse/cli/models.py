"""``kdcollapse models [list]``: the registered models with their sizes."""

from __future__ import annotations

_EXAMPLES = """examples:
  kdcollapse models                         # every model, parameters with 100 classes
  kdcollapse models list 'resnet*' --classes 10
  kdcollapse models list wrn_40_2 --in-channels 1
"""


def register(subparsers) -> None:
    from kdcollapse.cli._common import HelpFormatter

    p = subparsers.add_parser("models", help="List the registered models; convert community weights.",
                              description="List the registered models with their parameter counts and "
                              "feature dimensions (`models list`, the default).", epilog=_EXAMPLES,
                              formatter_class=HelpFormatter)
    p.set_defaults(func=_run, pattern="*", classes=100, in_channels=3)
    actions = p.add_subparsers(dest="action", metavar="ACTION")
    q = actions.add_parser("list", help="registered models (shell-style PATTERN)", formatter_class=HelpFormatter)
    q.add_argument("pattern", nargs="?", default="*", help="shell-style name pattern")
    q.add_argument("--classes", type=int, default=100, help="number of classes of the head")
    q.add_argument("--in-channels", type=int, default=3, help="input channels (1 for grey images)")
    q.set_defaults(func=_run)


def _run(args) -> int:
    from kdcollapse.errors import KdcollapseError
    from kdcollapse.models import count_parameters, create_model, list_models

    names = list_models(args.pattern)
    if not names:
        raise KdcollapseError(f"no model matches {args.pattern!r}; valid names: {', '.join(list_models())}")
    print(f"{'model':<16} {'parameters':>12} {'feature_dim':>11}   ({args.classes} classes, "
          f"{args.in_channels} input channels)")
    for name in names:
        model = create_model(name, args.classes, in_channels=args.in_channels)
        print(f"{name:<16} {count_parameters(model):>12,} {model.feature_dim:>11}")
    return 0
