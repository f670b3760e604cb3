from __future__ import annotations

from collections.abc import Sequence

from kdcollapse.errors import KdcollapseError


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e-2 or abs(value) >= 1e4 else f"{value:.2f}"
    return str(value)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A GitHub-flavoured markdown table; floats get a compact fixed format."""
    for n, row in enumerate(rows):
        if len(row) != len(header):
            raise KdcollapseError(f"markdown_table: row {n} has {len(row)} cells for {len(header)} columns")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"
