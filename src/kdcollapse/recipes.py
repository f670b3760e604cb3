"""The recipes (run configs of the papers' experiments) shipped inside the package.

They are the repository's ``configs/`` folder, installed as ``kdcollapse/configs`` (one copy: in a source
checkout ``src/kdcollapse/configs`` links to ``configs/``). A recipe's name is its path there without
``.yaml``, e.g. ``cifar100/kd/resnet32x4_resnet8x4``; ``--config`` takes a name as well as a file.
"""

from __future__ import annotations

import argparse
import difflib
import fnmatch
import os
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


def regenerate(files: dict[Path, str], argv: list[str] | None, doc: str, script: str) -> int:
    """The command line of a script that generates files of the repository from tables (``configs/generate.py``
    and ``configs/intra_class/generate.py``, the recipes; ``studies/papers/generate.py``, the papers' study
    files), ``script`` its path: write each file of ``files`` ({path: text}) whose text on disk differs; with
    ``--check``, write nothing and return 1, naming them, where one differs. ``doc``: the script's help."""
    parser = argparse.ArgumentParser(prog=f"python {script}", description=doc,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    check = parser.parse_args(argv).check
    stale = [path for path, text in files.items() if not path.is_file() or path.read_text() != text]
    if check:
        if stale:
            print(f"out of date (run python {script}):", *map(os.path.relpath, stale), sep="\n  ")
        return 1 if stale else 0
    for path in stale:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(files[path])
    return 0
