"""Generated pages: a block of a markdown page written between two marker lines. With
:func:`kdcollapse.runs.write_files` (what differs from disk, written unless ``--check``) the one mechanism of every
generated page: ``kdcollapse study report`` (the summary and the derived tables), ``kdcollapse token-report``,
``kdcollapse geometry ufm`` and the intra-class theorems' page."""

from __future__ import annotations

from kdcollapse.errors import ConfigError


def fill(page: str, begin: str, end: str, body: str, missing: str, goes: str = "where the tables go") -> str:
    """``page`` with everything between the marker lines ``begin`` and ``end`` replaced by ``body`` (written right
    after ``begin`` and its newline; ``body`` ends with the newline before ``end``); what is outside the markers is
    kept as written. Without both markers: a :class:`ConfigError` ``"{missing}; put the two lines ... {goes}"``."""
    if begin not in page or end not in page:
        raise ConfigError(f"{missing}; put the two lines\n{begin}\n{end}\n{goes}")
    head, _, rest = page.partition(begin)
    return head + begin + "\n" + body + end + rest.partition(end)[2]
