"""README examples that a change could break silently (issue 42): the table's config rows load on the recipes
they name, and the catalogue functions it names take what they return. The fenced commands of README.md and
docs/*.md run in tests/test_doc_commands.py."""

import re
import shlex
from pathlib import Path

import pytest

from kdcollapse.config import load_config
from kdcollapse.losses import get_loss, list_losses
from kdcollapse.recipes import config_file

README = (Path(__file__).resolve().parents[1] / "README.md").read_text()
# every `kdcollapse train|distill --config X ...` in README's table: the config exists and the overrides load
COMMANDS = sorted({m for m in re.findall(r"`(kdcollapse (?:train|distill) --config [^`]+)`", README)
                   if "--config FILE" not in m})  # the synopsis rows name no recipe


def _argv(command: str) -> tuple[str, list[str]]:
    words = shlex.split(command.replace("[", "").replace("]", ""))
    config = words[words.index("--config") + 1]
    return config, [w for w in words[3:] if "=" in w and not w.startswith("-")]


def test_the_readme_names_commands():
    assert len(COMMANDS) >= 5, COMMANDS


@pytest.mark.parametrize("command", COMMANDS)
def test_a_readme_command_loads_its_recipe_and_overrides(command):
    config, overrides = _argv(command)
    if "teacher.checkpoint" in command or "distill" in command:
        overrides = [o for o in overrides if not o.startswith("teacher.")]
    path = config_file(config)
    assert path.is_file(), (command, path)
    load_config(path, overrides)


def test_list_losses_is_one_line_each_and_get_loss_takes_what_it_returns():
    infos = list_losses()
    assert all("\n" not in repr(info) and len(repr(info)) < 200 for info in infos)
    assert all(get_loss(info) is info and get_loss(info.name) is info for info in infos)
