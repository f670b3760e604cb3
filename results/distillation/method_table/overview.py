"""The sorted overview table of a method-table page, derived from its `summary.json` (what `kdcollapse study
report` wrote) and, optionally, a step-cost table and the same page's summary with another teacher.

    python results/distillation/method_table/overview.py results/distillation/method_table \
        --cost results/benchmarks/kd_methods_cost_fashion_mnist.md \
        --previous /tmp/summary_b0eb412.json --previous-label "92.88 % teacher"

It writes the table between the page's `<!-- overview ... -->` and `<!-- end of overview -->` lines
(`--check`: exit 1 if the page holds another table). Rows: the first section's cells, sorted by mean
last-epoch test accuracy; "− KD", Holm p and verdict are that section's comparisons against KD, as the
report computed them. The papers' column holds the CIFAR-100 resnet32x4 -> resnet8x4 numbers of the DHKD
paper's Table 1 (student, KD, FitNet, RKD, CRD, OFD, ReviewKD, DKD, DHKD), the DKL paper's Table 5
(IKL-KD) and the logit-standardization and MLKD numbers issue 24 quotes.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path

from kdcollapse.report import markdown_table

PAPER = {"student": "72.50", "KD": "73.33", "FitNet": "73.50", "RKD": "71.90", "CRD": "75.51", "OFD": "74.95",
         "ReviewKD": "75.63", "DKD": "76.32", "DHKD": "76.54", "IKL-KD": "76.59", "KD + LS": "76.62",
         "DKD + LS": "77.01", "MLKD": "77.08", "MLKD + LS": "78.28"}
BEGIN, END = "<!-- overview", "<!-- end of overview -->"
LABEL = re.compile(r"(?P<short>.+?) \((?P<setting>.+)\)$")


def first_section(summary: dict) -> dict[str, tuple[str, str]]:
    """Short name -> (setting, "mean ± std") of the first section's cells."""
    out = {}
    for label, row in summary["sections"][0]["cells"].items():
        m = LABEL.match(label)
        short, setting = ("student", "—") if label.startswith("student alone") else (m["short"], m["setting"])
        out[short] = (setting, row[1])
    return out


def costs(path: Path | None) -> dict[str, str]:
    """Method -> "CPU time vs KD" from a bench_kd_methods_cost table (first table of the file)."""
    if path is None:
        return {}
    out = {}
    for line in path.read_text().splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) > 3 and re.fullmatch(r"[\d.]+", cols[3] or "x"):
            out.setdefault(cols[0].removesuffix(" (defaults)"), cols[3])
    return out


def table(summary: dict, cost: dict[str, str], previous: dict | None, previous_label: str) -> str:
    cells = first_section(summary)
    against = {c["a"]: c for c in summary["comparisons"] if c["b"] == "KD"}
    old = first_section(previous) if previous else {}
    rows = []
    for short, (setting, acc) in cells.items():
        c = against.get(short)
        diff = [f"{c['mean']:+.2f}", f"{c['holm_p']:.3f}", c["verdict"]] if c else ["—", "—", "—"]
        before = [old[short][1] + (f" ({old[short][0]})" if old[short][0] != setting else "")
                  if short in old else ""] if previous else []
        rows.append((float(acc.split(" ± ")[0]), [
            "student alone (CE)" if short == "student" else short, setting, acc, *diff, *before,
            *([cost.get(short, "—")] if cost else []), PAPER.get(short, "")]))
    header = ["method", "setting chosen on val", "last-epoch test acc (%)", "− KD (pp)", "Holm p", "verdict",
              *([f"with the {previous_label} (setting if another)"] if previous else []),
              *(["step CPU time vs KD"] if cost else []), "paper, CIFAR-100 res32x4→res8x4 (%)"]
    return markdown_table(header, [r for _, r in sorted(rows, key=lambda r: -r[0])])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("page", type=Path, help="the page's folder (summary.json, README.md)")
    parser.add_argument("--cost", type=Path, help="a bench_kd_methods_cost table")
    parser.add_argument("--previous", type=Path, help="the same page's summary.json with another teacher")
    parser.add_argument("--previous-label", default="previous teacher")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    summary = json.loads((args.page / "summary.json").read_text())
    previous = json.loads(args.previous.read_text()) if args.previous else None
    text = table(summary, costs(args.cost), previous, args.previous_label)
    readme = args.page / "README.md"
    page = readme.read_text()
    start, end = page.index(BEGIN), page.index(END)
    start = page.index("\n", start) + 1
    new = page[:start] + text.rstrip("\n") + "\n" + page[end:]
    if args.check:
        return int(new != page)
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main())
