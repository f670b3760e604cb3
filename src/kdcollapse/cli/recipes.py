"""``kdcollapse recipes list|show``: the run configs shipped with the package."""

from __future__ import annotations

_EXAMPLES = """examples:
  kdcollapse recipes list
  kdcollapse recipes list 'cifar100/dhkd/*'
  kdcollapse recipes show fashion_mnist/kd
  kdcollapse distill --config fashion_mnist/kd train.epochs=5     # --config takes a recipe name
"""


def register(subparsers) -> None:
    from kdcollapse.cli._common import HelpFormatter

    p = subparsers.add_parser("recipes", help="List and show the shipped run configs (recipes).",
                              description="The papers' run configs, installed with the package; "
                              "`--config NAME` of train/distill takes their names.", epilog=_EXAMPLES,
                              formatter_class=HelpFormatter)
    actions = p.add_subparsers(dest="action", metavar="ACTION", required=True)
    q = actions.add_parser("list", help="recipe names (shell-style PATTERN)", formatter_class=HelpFormatter)
    q.add_argument("pattern", nargs="?", default="*", help="shell-style name pattern")
    q.set_defaults(func=_list)
    s = actions.add_parser("show", help="print a recipe", formatter_class=HelpFormatter)
    s.add_argument("name", help="a recipe name, e.g. cifar100/kd/resnet32x4_resnet8x4")
    s.set_defaults(func=_show)


def _list(args) -> int:
    from kdcollapse.errors import ConfigError
    from kdcollapse.recipes import list_recipes

    names = list_recipes(args.pattern)
    if not names:
        raise ConfigError(f"no recipe matches {args.pattern!r}; `kdcollapse recipes list` shows them all")
    print("\n".join(names))
    return 0


def _show(args) -> int:
    from kdcollapse.recipes import recipe_path

    path = recipe_path(args.name)
    print(f"# {path}")
    print(path.read_text(), end="")
    return 0
