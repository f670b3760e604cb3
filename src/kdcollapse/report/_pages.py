"""Generated pages: a block of a markdown page written between two marker lines, and the files a report writes
compared with what is on disk (``--check``). One mechanism for every generated page: ``kdcollapse study report``
(the summary and the derived tables), ``kdcollapse token-report``, ``kdcollapse geometry ufm`` and the
intra-class theorems' page."""

from __future__ import annotations

import platform
from pathlib import Path

from kdcollapse.errors import ConfigError


def fill(page: str, begin: str, end: str, body: str, missing: str, goes: str = "where the tables go") -> str:
    """``page`` with everything between the marker lines ``begin`` and ``end`` replaced by ``body`` (written right
    after ``begin`` and its newline; ``body`` ends with the newline before ``end``); what is outside the markers is
    kept as written. Without both markers: a :class:`ConfigError` ``"{missing}; put the two lines ... {goes}"``."""
    if begin not in page or end not in page:
        raise ConfigError(f"{missing}; put the two lines\n{begin}\n{end}\n{goes}")
    head, _, rest = page.partition(begin)
    return head + begin + "\n" + body + end + rest.partition(end)[2]


def write_files(files: dict[Path, str | bytes], check: bool = False) -> list[Path]:
    """The files of ``files`` whose content on disk differs from the given one (text or bytes; a missing file
    differs), in order; unless ``check``, each of them is written (atomically). ``check``: nothing is written,
    the caller reports the returned files as out of date."""
    changed = [path for path, content in files.items() if not path.is_file() or (
        path.read_bytes() if isinstance(content, bytes) else path.read_text()) != content]
    if not check:
        from kdcollapse.runs import replacing, write_text

        for path in changed:
            if isinstance(files[path], bytes):
                with replacing(path) as tmp:
                    tmp.write_bytes(files[path])
            else:
                write_text(path, files[path])
    return changed


def machine() -> str:
    """Where a computation ran, for a page's records: the CPU's model name (``/proc/cpuinfo``, else the platform's
    machine name), torch's CPU capability, the torch and Python versions. Float results can differ between CPU
    families (MKL and oneDNN choose their kernels by CPU), so a generated page names it."""
    import torch

    from kdcollapse.distributed import cpu_capability

    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return (f"{cpu} (torch CPU capability {cpu_capability()}), torch {torch.__version__}, "
            f"Python {platform.python_version()}")
