"""Downloads from the canonical sources, verified by checksum and written atomically.

A file is streamed into a temporary ``.<name>.*.part`` file in the target directory while its digest is
computed; only if the digest matches is it renamed to its final name (``os.replace`` is atomic), so an
interrupted or corrupt download never leaves a file that looks valid. Mirrors are tried in order. A
transfer stops as soon as it exceeds the file's known size, and the whole download has a deadline; the
``.part`` files of a killed earlier attempt (no process holds their lock any more) are removed.
"""

from __future__ import annotations

import glob
import hashlib
import http.client
import os
import tempfile
import time
import urllib.request
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kdcollapse import __version__
from kdcollapse.data._dataset import dataset_entry, default_download_root
from kdcollapse.errors import DataError

try:
    import fcntl
except ImportError:  # Windows
    fcntl = None


@dataclass(frozen=True)
class RemoteFile:
    """One file of a dataset: its name, where to get it (mirrors in order) and its digest.

    ``checksum`` is ``"sha256:<hex>"``, or ``"md5:<hex>"`` where no SHA-256 is published.
    """

    name: str
    urls: tuple[str, ...]
    checksum: str
    size: int


def _mirrored(name: str, bases: Sequence[str], checksum: str, size: int) -> RemoteFile:
    return RemoteFile(name, tuple(base + name for base in bases), checksum, size)


_FASHION = (
    "http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
    "https://raw.githubusercontent.com/zalandoresearch/fashion-mnist/master/data/fashion/",
)
_MNIST = (
    "https://ossci-datasets.s3.amazonaws.com/mnist/",
    "https://storage.googleapis.com/cvdf-datasets/mnist/",
    "http://yann.lecun.com/exdb/mnist/",
)
_TORONTO = ("https://www.cs.toronto.edu/~kriz/",)

SOURCES: dict[str, tuple[RemoteFile, ...]] = {
    "fashion_mnist": (
        _mirrored("train-images-idx3-ubyte.gz", _FASHION,
                  "sha256:08dc20ab1689590a0bcd66e874647b6ee8464e2d501b5a3f1f78831db19a3fdc", 26421880),
        _mirrored("train-labels-idx1-ubyte.gz", _FASHION,
                  "sha256:b0197879cbda89f3dc7b894f9fd52b858e68ea4182b6947c9d8c2b67e5f18dcc", 29515),
        _mirrored("t10k-images-idx3-ubyte.gz", _FASHION,
                  "sha256:78dcbbfb5a27efaf1b6c1d616caca68560be8766c5bffcb2791df9273a534229", 4422102),
        _mirrored("t10k-labels-idx1-ubyte.gz", _FASHION,
                  "sha256:42bd18137a62d5998cdeae52bf3a0676ac6b706f5cf8439b47bb5b151ae3dccf", 5148),
    ),
    "mnist": (
        _mirrored("train-images-idx3-ubyte.gz", _MNIST,
                  "sha256:440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609", 9912422),
        _mirrored("train-labels-idx1-ubyte.gz", _MNIST,
                  "sha256:3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c", 28881),
        _mirrored("t10k-images-idx3-ubyte.gz", _MNIST,
                  "sha256:8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6", 1648877),
        _mirrored("t10k-labels-idx1-ubyte.gz", _MNIST,
                  "sha256:f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6", 4542),
    ),
    "cifar10": (
        _mirrored("cifar-10-python.tar.gz", _TORONTO,
                  "sha256:6d958be074577803d12ecdefd02955f39262c83c16fe9348329d7fe0b5c001ce", 170498071),
    ),
    "cifar100": (
        _mirrored("cifar-100-python.tar.gz", _TORONTO,
                  "sha256:85cd44d02ba6437773c5bbd22e183051d648de2e7d6b014e1ef29b855ba677a7", 169001437),
    ),
    "tiny_imagenet": (
        _mirrored("tiny-imagenet-200.zip", ("http://cs231n.stanford.edu/",),
                  "md5:90528d7ca1a48142e341f4ef8d21d0de", 248100043),
    ),
}  # fmt: skip

# Archives unpacked after download because their loader reads files, not the archive.
_UNPACK = {"tiny_imagenet": ("tiny-imagenet-200.zip", "tiny-imagenet-200")}

NOT_DOWNLOADABLE = {
    "imagenet": (
        "ImageNet (ILSVRC 2012) cannot be downloaded automatically: its licence requires each user to "
        "register at https://image-net.org/download.php and accept the terms of access. Download "
        "ILSVRC2012_img_train.tar and ILSVRC2012_img_val.tar there, unpack the train archive into "
        "train/<wnid>/*.JPEG (one inner tar per class) and sort the validation images into "
        "val/<wnid>/*.JPEG using the devkit's ground-truth labels, then pass --root to that folder or "
        "put it at ~/.cache/kdcollapse/imagenet."
    ),
    "digits": "digits ships with kdcollapse (src/kdcollapse/data/digits.npz); there is nothing to download.",
    "gaussian_mixture": "gaussian_mixture is generated on the fly; there is nothing to download.",
    "image_folder": "image_folder reads any folder you point --root at; there is nothing to download.",
    "fashion_mnist_pairs": "fashion_mnist_pairs is built from Fashion-MNIST's files when loaded; "
                           "run `kdcollapse data download fashion_mnist` instead.",
}

_CHUNK = 1 << 20


def file_digest(path: str | Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm)
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _parse_checksum(checksum: str) -> tuple[str, str]:
    algorithm, _, expected = checksum.partition(":")
    if algorithm not in ("sha256", "md5") or not expected:
        raise DataError(f"checksum must be 'sha256:<hex>' or 'md5:<hex>', got {checksum!r}")
    return algorithm, expected.lower()


def verify_file(path: str | Path, checksum: str) -> bool:
    """Whether the file at ``path`` exists and has the digest ``checksum`` (``"sha256:<hex>"``)."""
    algorithm, expected = _parse_checksum(checksum)
    return Path(path).is_file() and file_digest(path, algorithm) == expected


def _fetch(url: str, part: Path, algorithm: str, label: str, progress: bool, timeout: float, size: int | None,
           deadline: float) -> str:
    """Stream ``url`` into ``part``; return the hex digest of what was written.

    Raises ``ConnectionError`` as soon as the server announces another size or sends more than ``size``
    bytes (when known) and when fewer arrive; ``TimeoutError`` when ``time.monotonic()`` passes
    ``deadline`` (checked after every read; a read itself waits at most ``timeout`` seconds).
    """
    from tqdm.auto import tqdm

    digest = hashlib.new(algorithm)
    request = urllib.request.Request(url, headers={"User-Agent": f"kdcollapse/{__version__}"})
    with urllib.request.urlopen(request, timeout=timeout) as response, open(part, "wb") as out:
        announced = int(response.headers.get("Content-Length") or 0) or None
        if size is not None and announced is not None and announced != size:
            raise ConnectionError(f"the server announces {announced} bytes, expected {size}")
        total = size or announced
        received = 0
        with tqdm(total=total, unit="B", unit_scale=True, desc=label, disable=not progress) as bar:
            # read1: whatever has arrived (at most one byte past the expected size), so the checks run often
            while chunk := response.read1(_CHUNK if total is None else min(_CHUNK, total + 1 - received)):
                received += len(chunk)
                if total is not None and received > total:
                    raise ConnectionError(f"the server sent more than the expected {total} bytes")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"deadline passed after {received} of {total or '?'} bytes")
                out.write(chunk)
                digest.update(chunk)
                bar.update(len(chunk))
        if total is not None and received != total:
            raise ConnectionError(f"connection closed after {received} of {total} bytes")
        out.flush()
        os.fsync(out.fileno())
    return digest.hexdigest()


def download_file(
    urls: Sequence[str], dest: str | Path, checksum: str, *, size: int | None = None, progress: bool = True,
    timeout: float = 60.0, deadline: float = 3600.0,
) -> Path:  # fmt: skip
    """Download ``dest`` from the first of ``urls`` that delivers a file with digest ``checksum``.

    Keeps an existing ``dest`` that already verifies. The data goes to a temporary file beside ``dest``
    that is renamed only after verification and removed on any failure (including Ctrl-C); ``.part``
    files that an earlier, killed attempt left behind are removed first. A transfer is stopped as soon as
    it exceeds ``size`` bytes (when given) and fails if fewer arrive; ``timeout`` (seconds) bounds each
    read, ``deadline`` (seconds) the whole call. Raises ``DataError`` listing each URL and why it failed.
    """
    dest = Path(dest)
    algorithm, expected = _parse_checksum(checksum)
    if verify_file(dest, checksum):
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_parts(dest)
    ends = time.monotonic() + deadline
    failures = []
    for url in urls:
        if time.monotonic() > ends:
            failures.append(f"{url}: not tried, the deadline of {deadline:g} s has passed")
            continue
        fd, name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".part", dir=dest.parent)
        part = Path(name)
        try:
            _hold(fd)  # for as long as this process writes the part file, it is not stale
            got = _fetch(url, part, algorithm, dest.name, progress, timeout, size, ends)
            if got == expected:
                os.replace(part, dest)
                return dest
            failures.append(f"{url}: {algorithm} mismatch (got {got}, expected {expected})")
        except (OSError, ValueError, http.client.HTTPException) as err:  # URLError is an OSError
            failures.append(f"{url}: {type(err).__name__}: {err}")
        finally:
            part.unlink(missing_ok=True)
            os.close(fd)
    raise DataError(f"could not download {dest.name}:\n" + "\n".join(f"  {f}" for f in failures))


def _hold(fd: int) -> None:
    """Lock an open part file exclusively (released when it is closed, or when its process dies)."""
    if fcntl is not None:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)


def remove_stale_parts(dest: Path) -> list[Path]:
    """Remove the ``.<name>.*.part`` files beside ``dest`` that no running download holds (left by a killed
    process); returns them. Without ``fcntl`` (Windows) nothing tells a live one apart, so none is removed."""
    if fcntl is None:
        return []
    removed = []
    for part in dest.parent.glob(f".{glob.escape(dest.name)}.*.part"):
        try:
            fd = os.open(part, os.O_RDONLY)
        except FileNotFoundError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            part.unlink(missing_ok=True)  # while holding the lock: no download can have it
            removed.append(part)
        except BlockingIOError:
            pass  # another process is downloading into it right now
        finally:
            os.close(fd)
    return removed


def download_dataset(name: str, root: str | Path | None = None, *, progress: bool = True) -> Path:
    """Download (and verify) every file of dataset ``name`` into ``root`` (default: see
    ``default_download_root``); returns the directory, which ``load_dataset(name, split)`` then finds."""
    dataset_entry(name)  # unknown names: error listing the valid ones
    if name in NOT_DOWNLOADABLE:
        raise DataError(NOT_DOWNLOADABLE[name])
    root = Path(root).expanduser() if root is not None else default_download_root(name)
    for remote in SOURCES[name]:
        download_file(remote.urls, root / remote.name, remote.checksum, size=remote.size, progress=progress)
    if name in _UNPACK:
        archive, folder = _UNPACK[name]
        _unzip_atomically(root / archive, root / folder)
    return root


def _unzip_atomically(archive: Path, folder: Path) -> None:
    """Extract ``archive`` (whose single top-level folder is ``folder.name``) into ``folder``, atomically."""
    if folder.exists():
        return
    with tempfile.TemporaryDirectory(prefix=f".{folder.name}.", dir=folder.parent) as tmp:
        try:
            with zipfile.ZipFile(archive) as zf:
                zf.extractall(tmp)  # zipfile drops absolute paths and '..' parts
        except zipfile.BadZipFile as err:
            raise DataError(f"{archive}: {err}") from None
        extracted = Path(tmp) / folder.name
        if not extracted.is_dir():
            raise DataError(f"{archive}: expected a top-level folder {folder.name}/")
        os.replace(extracted, folder)
