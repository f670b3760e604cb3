"""Docs and code cite only what exists: every relative markdown link, every repository path (``src/...``,
``docs/...``, ``results/...``, ``benchmarks/...``, ``configs/...``, ``tests/...``) and every markdown file
named in docs/, README.md, results/, the scripts and the package's docstrings and comments; every
``kdcollapse.x.y`` named in the markdown; and no document outside the repository (cite the paper instead)."""

import importlib
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
MARKDOWN = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "results").rglob("*.md")])
SOURCES = sorted((REPO / "src").rglob("*.py"))
SCRIPTS = sorted([*(REPO / "benchmarks").glob("*.py"), *(REPO / "results").rglob("*.py"),
                  *(REPO / "configs").rglob("*.py"),
                  *(p for p in (REPO / "tests").glob("*.py") if p.name != "test_docs.py")])  # its examples fail

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
# A path from the repository root: one of its top-level folders, then path characters.
REPO_PATH = re.compile(r"(?<![\w./-])((?:src|docs|results|benchmarks|configs|tests)/[\w./-]*[\w/])")
# A markdown file named without a folder: in markdown any (``training.md``: a page of docs/ or beside the
# citing file); in code only a capitalised document name (``README.md``), since lowercase names there are
# mostly files the code writes (``report.md``).
BARE_MD = re.compile(r"(?<![\w./-])([\w-]+\.md)\b")
CAPITAL_MD = re.compile(r"^[A-Z][A-Z_]*\.md$")
PLACEHOLDER = re.compile(r"[*<>{}$]|\.\.\.")
# Documents outside the repository: the project cites papers and its own docs instead.
OUTSIDE = re.compile(r"\bSPEC\b|\bSTYLE\.md\b|project brief")


def _is_placeholder(text: str, end: int, cited: str) -> bool:
    """A pattern or a template (``results/bench_*.md``, ``runs/<name>``, ``{area}/...``), not a file."""
    return bool(PLACEHOLDER.search(cited)) or text[end:end + 1] in "*<{$"


def cited_paths(text: str) -> set[str]:
    return {m.group(1).rstrip("/.") for m in REPO_PATH.finditer(text) if not _is_placeholder(text, m.end(), m.group(1))}


def missing_links(path: Path) -> list[str]:
    missing = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL or an anchor in the same page
        if not (path.parent / target.split("#")[0]).exists():
            missing.append(target)
    return missing


def missing_citations(path: Path) -> list[str]:
    text = path.read_text()
    missing = [p for p in sorted(cited_paths(text)) if not (REPO / p).exists()]
    for name in sorted(set(BARE_MD.findall(LINK.sub(" ", text)))):  # links are checked by missing_links
        if path.suffix == ".py" and not CAPITAL_MD.match(name):
            continue
        if not any((folder / name).exists() for folder in (REPO, REPO / "docs", path.parent)):
            missing.append(name)
    return missing


def outside_citations(path: Path) -> list[str]:
    return sorted(set(OUTSIDE.findall(path.read_text())))


# A dotted name in the text; a quoted one ("kdcollapse.model", a format tag) is a value, not a name.
DOTTED = re.compile(r"(?<![\w./\"-])(kdcollapse(?:\.[A-Za-z_]\w*)+)")


def resolves(dotted: str) -> bool:
    """``kdcollapse.runs.load_model``: the longest importable module prefix, then attributes."""
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for name in parts[i:]:
            if not hasattr(obj, name):
                return False
            obj = getattr(obj, name)
        return True
    return False


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


@pytest.mark.parametrize("path", MARKDOWN, ids=rel)
def test_markdown_links_resolve(path):
    assert not missing_links(path), f"{rel(path)} links to files that do not exist"


@pytest.mark.parametrize("path", [*MARKDOWN, *SOURCES, *SCRIPTS], ids=rel)
def test_cited_files_exist(path):
    assert not missing_citations(path), f"{rel(path)} cites files that do not exist"


@pytest.mark.parametrize("path", MARKDOWN, ids=rel)
def test_named_modules_and_functions_exist(path):
    """``kdcollapse.x.y`` in the docs names a module, class or function that exists."""
    missing = sorted({name for name in DOTTED.findall(path.read_text()) if not resolves(name)})
    assert not missing, f"{rel(path)} names what the package does not have: {missing}"


@pytest.mark.parametrize("path", [*MARKDOWN, *SOURCES, *SCRIPTS], ids=rel)
def test_no_citation_of_documents_outside_the_repository(path):
    assert not outside_citations(path), f"{rel(path)}: cite the paper (section, equation) or a page of docs/"


def test_the_checker_finds_what_it_should():
    text = ("see docs/training.md, `src/kdcollapse/nothing.py` and [x](../results/none.md#a); SPEC.md §3; "
            "results/bench_*.md and runs/<name>/ are patterns; https://x.org/docs/a.md is a URL")
    assert cited_paths(text) == {"docs/training.md", "src/kdcollapse/nothing.py"}
    assert set(BARE_MD.findall(text)) == {"SPEC.md"}
    assert LINK.findall(text) == ["../results/none.md#a"]
    assert OUTSIDE.findall(text) == ["SPEC"]
    assert resolves("kdcollapse.runs.load_model") and not resolves("kdcollapse.train.load_model")
