"""Write a method-table study's stage 2 from its stage 1: the value each method's section chooses on validation.

    python results/distillation/method_table/stage2.py results/distillation/method_table/study.yaml [--check]

The choice is the study report's own (`kdcollapse.study.summarise`: the grid value with the highest seed-0
validation accuracy, the first on a tie); this script only copies it into the file, in two places: the
`final` group's `setting` list (the chosen grid entries, by their YAML anchors) and the first section's
cells (label "NAME (VALUE)" and the stage-1 cell's tag). `--check` exits 1 if the file does not hold the
choices of the runs present. It reads the grid entries from the file's `define` block, written one entry per
anchor as `&anchor {key: K, name: N, recipe: R, tag: T, value: V, set: [...]}`.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from kdcollapse.study import collect, load_study, summarise

ENTRY = re.compile(r"&(?P<anchor>[\w.-]+) \{key: (?P<key>\w+), name: (?P<name>[^,]+), recipe: \S+, "
                   r"tag: (?P<tag>[^,]+), value: (?P<value>[^,]+),")
CHOSEN = " (chosen on val)"
CELL = re.compile(r'(\s*- \{label: )"[^"]*"(, short: "[^"]*", group: (grid|final), where: \{key: (\w+))(.*)')


def choices(path: Path) -> dict[str, str]:
    """Method key -> the value label its stage-1 section chose, for the methods whose whole grid ran."""
    study = load_study(path)
    _, summary = summarise(study, collect(study))
    grid = {}
    for m in ENTRY.finditer(path.read_text()):
        grid[m["key"]] = grid.get(m["key"], 0) + 1
    out = {}
    for section, spec in zip(summary["sections"], study.summary["sections"]):
        if "choose" not in spec:
            continue
        key = spec["cells"][0]["where"]["key"]
        picked = [label.removesuffix(CHOSEN) for label in section["cells"] if label.endswith(CHOSEN)]
        if len(section["cells"]) < grid[key]:
            print(f"{key}: {len(section['cells'])} of {grid[key]} grid values ran; no choice yet", file=sys.stderr)
        elif picked:
            out[key] = picked[0]
    return out


def rewrite(text: str, chosen: dict[str, str]) -> str:
    entries = {(m["key"], m["value"]): m for m in ENTRY.finditer(text)}
    picks = {key: entries[key, value] for key, value in chosen.items()}
    lines = text.splitlines(keepends=True)
    in_final = False
    for i, line in enumerate(lines):
        if re.match(r"\s*- group: ", line):
            in_final = "group: final" in line
        if in_final and re.match(r"\s*setting: \[", line):
            if not line.rstrip().endswith("]"):
                raise SystemExit("error: the final group's setting list must be on one line")
            key_of = {m["anchor"]: m["key"] for m in entries.values()}
            new = [f"*{picks[key_of[a]]['anchor']}" if key_of[a] in picks else f"*{a}"
                   for a in re.findall(r"\*([\w.-]+)", line)]
            lines[i] = line[:line.index("[")] + "[" + ", ".join(new) + "]\n"
            in_final = False
        cell = CELL.match(line)
        if cell and cell[4] in picks:
            m = picks[cell[4]]
            rest = cell[5]
            if cell[3] == "grid":
                rest = re.sub(r'tag: "[^"]*"', f'tag: "{m["tag"]}"', rest)
            lines[i] = f'{cell[1]}"{m["name"]} ({m["value"]})"{cell[2]}{rest}\n'
    return "".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("study", type=Path)
    parser.add_argument("--check", action="store_true", help="exit 1 if the file does not hold the choices")
    args = parser.parse_args(argv)
    chosen = choices(args.study)
    text = args.study.read_text()
    new = rewrite(text, chosen)
    for key, value in chosen.items():
        print(f"{key}: {value}")
    if args.check:
        return int(new != text)
    args.study.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
