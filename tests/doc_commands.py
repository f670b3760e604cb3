"""The commands of the fenced blocks of README.md and docs/*.md, as a reader would type them, and what a
test appends to run each on a tiny budget. Used by tests/test_doc_commands.py.

A command is a ``$ ``-line of a block that has them (the rest of such a block is output), or else a line of
a plain, ``bash`` or ``console`` block that starts with a program a reader runs (``kdcollapse``,
``torchrun``, ``python``, ``make``, after ``VAR=value`` words); a trailing backslash joins lines. A line
with ``[--option ...]`` is a synopsis, not a command.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
SHELL = ("", "console", "bash", "sh", "shell")
PROGRAMS = ("kdcollapse", "torchrun", "python", "make", ".venv/bin/python", "PYTHONPATH=src", "ls")
ENV = re.compile(r"^(?:[A-Z_]+=\S*\s+)+")


@dataclass
class Command:
    page: str  # relative to the repository
    line: int  # of the command's first line
    text: str  # continuation lines joined, comment kept
    output: list[str] = field(default_factory=list)  # the lines the page shows after it (console blocks)

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def words(self) -> list[str]:
        """The words after the environment assignments, comment dropped."""
        return shlex.split(ENV.sub("", self.text), comments=True)

    @property
    def synopsis(self) -> bool:
        return bool(re.search(r"\[--?\w", self.text)) and not self.text.lstrip().startswith("$")


def _program(line: str) -> bool:
    bare = ENV.sub("", line.strip())
    return bare.split(" ", 1)[0] in PROGRAMS or line.strip().startswith(PROGRAMS)


def page_commands(page: Path) -> list[Command]:
    text = page.read_text(encoding="utf-8")
    found: list[Command] = []
    for block in FENCE.finditer(text):
        if block.group(1) not in SHELL:
            continue
        first = text[:block.start()].count("\n") + 2  # the line after the fence
        lines = block.group(2).splitlines()
        console = any(line.startswith("$ ") for line in lines)
        i = 0
        while i < len(lines):
            line, start = lines[i], first + i
            if console and not line.startswith("$ "):
                if found and found[-1].line >= first:
                    found[-1].output.append(line)
                i += 1
                continue
            if not console and not _program(line):
                i += 1
                continue
            command = line.removeprefix("$ ")
            while command.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command.rstrip()[:-1].rstrip() + " " + lines[i].strip()
            while re.search(r"\[--?\w", command) and i + 1 < len(lines) and lines[i + 1].lstrip().startswith("["):
                i += 1  # a synopsis continued on indented lines
                command += " " + lines[i].strip()
            found.append(Command(str(page.relative_to(REPO)), start, command))
            i += 1
    return found


def all_commands() -> list[Command]:
    return [c for page in PAGES for c in page_commands(page)]
