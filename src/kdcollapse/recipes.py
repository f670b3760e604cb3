"""The recipes (run configs of the papers' experiments) shipped inside the package.

They are the repository's ``configs/`` folder, installed as ``kdcollapse/configs`` (one copy: in a source
checkout ``src/kdcollapse/configs`` links to ``configs/``). A recipe's name is its path there without
``.yaml``, e.g. ``cifar100/kd/resnet32x4_resnet8x4``; ``--config`` takes a name as well as a file.
"""

from __future__ import annotations

import difflib
import fnmatch
from pathlib import Path

from kdcollapse.errors import ConfigError

RECIPES_DIR = Path(__file__).parent / "configs"


def list_recipes(pattern: str = "*") -> list[str]:
    """Sorted recipe names matching a shell-style ``pattern`` (``"cifar100/kd/*"``)."""
    if not RECIPES_DIR.is_dir():
        return []
    names = (p.relative_to(RECIPES_DIR).with_suffix("").as_posix() for p in RECIPES_DIR.rglob("*.yaml"))
    return sorted(n for n in names if fnmatch.fnmatchcase(n, pattern))


def recipe_path(name: str) -> Path:
    """The file of recipe ``name`` (with or without ``.yaml`` and a leading ``configs/``); a
    ``ConfigError`` with close matches for an unknown one."""
    key = name.removeprefix("configs/").removesuffix(".yaml")
    path = RECIPES_DIR / f"{key}.yaml"
    if key in list_recipes():
        return path
    close = difflib.get_close_matches(key, list_recipes(), n=3)
    hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
    raise ConfigError(f"no config file or recipe {name!r}.{hint} `kdcollapse recipes list` shows the recipes")


def config_file(value: str | Path) -> Path:
    """What ``--config`` names: an existing file, else a recipe."""
    path = Path(value)
    return path if path.is_file() else recipe_path(str(value))
