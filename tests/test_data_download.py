"""Downloads against a local HTTP server, and the ``kdcollapse data`` command line."""

from __future__ import annotations

import hashlib
import http.server
import io
import threading
import zipfile
from pathlib import Path

import pytest
from formats import write_idx_files, write_tiny_imagenet

from kdcollapse.cli import main
from kdcollapse.data import download_dataset, download_file, list_datasets, load_dataset, verify_file
from kdcollapse.data import _download
from kdcollapse.data._download import NOT_DOWNLOADABLE, SOURCES, RemoteFile
from kdcollapse.errors import DataError


class _Handler(http.server.BaseHTTPRequestHandler):
    files: dict[str, bytes] = {}
    requests: list[str] = []

    def do_GET(self):  # noqa: N802
        self.requests.append(self.path)
        if self.path.startswith("/error/"):
            self.send_error(500, "boom")
            return
        body = self.files.get(self.path.rsplit("/", 1)[-1])
        if body is None:
            self.send_error(404)
            return
        self.send_response(200)
        short = self.path.startswith("/short/")  # promise more than is sent, then hang up
        self.send_header("Content-Length", str(len(body) + (100 if short else 0)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def server():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def serve(**files: bytes) -> dict[str, str]:
    """Publish ``files`` on the server; returns their ``sha256:`` checksums."""
    _Handler.files.update(files)
    _Handler.requests.clear()
    return {name: "sha256:" + hashlib.sha256(data).hexdigest() for name, data in files.items()}


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_download_success_and_reuse(server, tmp_path):
    sums = serve(**{"a.bin": b"hello" * 1000})
    dest = download_file([f"{server}/files/a.bin"], tmp_path / "a.bin", sums["a.bin"], progress=False)
    assert dest.read_bytes() == b"hello" * 1000 and leftovers(tmp_path) == ["a.bin"]
    assert verify_file(dest, sums["a.bin"])
    download_file([f"{server}/files/a.bin"], dest, sums["a.bin"], progress=False)
    assert _Handler.requests == ["/files/a.bin"]  # the verified file was kept, not fetched again


def test_checksum_mismatch_leaves_nothing(server, tmp_path):
    serve(**{"b.bin": b"tampered"})
    wrong = "sha256:" + "0" * 64
    with pytest.raises(DataError, match=r"could not download b.bin:\n.*/files/b.bin: sha256 mismatch"):
        download_file([f"{server}/files/b.bin"], tmp_path / "b.bin", wrong, progress=False)
    assert leftovers(tmp_path) == []


def test_server_error_and_interruption_leave_nothing(server, tmp_path):
    sums = serve(**{"c.bin": b"x" * 5000})
    with pytest.raises(DataError, match=r"/error/c.bin: HTTPError: HTTP Error 500"):
        download_file([f"{server}/error/c.bin"], tmp_path / "c.bin", sums["c.bin"], progress=False)
    with pytest.raises(DataError, match=r"/short/c.bin: ConnectionError: connection closed after 5000 of 5100 bytes"):
        download_file([f"{server}/short/c.bin"], tmp_path / "c.bin", sums["c.bin"], progress=False, timeout=5)
    assert leftovers(tmp_path) == []


def test_interrupt_by_keyboard_leaves_nothing(server, tmp_path, monkeypatch):
    sums = serve(**{"d.bin": b"y" * 5000})

    def interrupted(url, part, *args):
        part.write_bytes(b"y" * 10)
        raise KeyboardInterrupt

    monkeypatch.setattr(_download, "_fetch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        download_file([f"{server}/files/d.bin"], tmp_path / "d.bin", sums["d.bin"], progress=False)
    assert leftovers(tmp_path) == []


def test_mirrors_are_tried_in_order(server, tmp_path):
    sums = serve(**{"e.bin": b"mirror"})
    urls = [f"{server}/error/e.bin", f"{server}/files/missing.bin", f"{server}/files/e.bin"]
    assert download_file(urls, tmp_path / "e.bin", sums["e.bin"], progress=False).read_bytes() == b"mirror"
    assert _Handler.requests == ["/error/e.bin", "/files/missing.bin", "/files/e.bin"]


def test_md5_checksums_and_bad_checksum_spec(server, tmp_path):
    serve(**{"f.bin": b"md5 only"})
    checksum = "md5:" + hashlib.md5(b"md5 only").hexdigest()
    assert download_file([f"{server}/files/f.bin"], tmp_path / "f.bin", checksum, progress=False).exists()
    with pytest.raises(DataError, match="checksum must be 'sha256:<hex>' or 'md5:<hex>'"):
        download_file([f"{server}/files/f.bin"], tmp_path / "g.bin", "crc32:1234", progress=False)


def test_download_dataset_then_load(server, tmp_path, monkeypatch):
    write_idx_files(tmp_path / "src", n_train=20, n_test=10)
    files = {p.name: p.read_bytes() for p in (tmp_path / "src").iterdir()}
    sums = serve(**files)
    remote = tuple(RemoteFile(name, (f"{server}/files/{name}",), sums[name], len(data)) for name, data in files.items())
    monkeypatch.setitem(SOURCES, "mnist", remote)
    root = download_dataset("mnist", tmp_path / "mnist", progress=False)
    assert len(load_dataset("mnist", "train", root=root)) == 20
    monkeypatch.setenv("KDCOLLAPSE_DATA", str(tmp_path / "env"))
    assert main(["data", "download", "mnist", "--no-progress"]) == 0
    assert len(load_dataset("mnist", "test")) == 10  # found through $KDCOLLAPSE_DATA/mnist


def test_download_tiny_imagenet_unpacks_the_zip(server, tmp_path, monkeypatch):
    write_tiny_imagenet(tmp_path / "src")
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for path in sorted((tmp_path / "src").rglob("*")):
            zf.write(path, path.relative_to(tmp_path / "src").as_posix())
    data = buffer.getvalue()
    serve(**{"tiny-imagenet-200.zip": data})
    checksum = "md5:" + hashlib.md5(data).hexdigest()
    remote = RemoteFile("tiny-imagenet-200.zip", (f"{server}/files/tiny-imagenet-200.zip",), checksum, len(data))
    monkeypatch.setitem(SOURCES, "tiny_imagenet", (remote,))
    root = download_dataset("tiny_imagenet", tmp_path / "tiny", progress=False)
    assert leftovers(root) == ["tiny-imagenet-200", "tiny-imagenet-200.zip"]
    assert len(load_dataset("tiny_imagenet", "test", root=root)) == 4


def test_every_dataset_has_a_source_or_an_explanation():
    for name in list_datasets():
        assert (name in SOURCES) != (name in NOT_DOWNLOADABLE), name
    for remotes in SOURCES.values():
        for remote in remotes:
            algorithm, _, digest = remote.checksum.partition(":")
            assert (algorithm, len(digest)) in (("sha256", 64), ("md5", 32)) and remote.urls


def test_download_refusals(tmp_path):
    with pytest.raises(DataError, match="licence requires each user to register"):
        download_dataset("imagenet", tmp_path)
    with pytest.raises(DataError, match="unknown dataset 'imagenet1k'"):
        download_dataset("imagenet1k", tmp_path)
    assert leftovers(tmp_path) == []


# --- the command line ------------------------------------------------------------------------------


def test_cli_list_and_info(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("KDCOLLAPSE_DATA", str(tmp_path))
    write_idx_files(tmp_path / "mnist")
    assert main(["data", "list"]) == 0
    out = capsys.readouterr().out
    assert all(name in out for name in list_datasets())
    assert f"found  {tmp_path / 'mnist'}" in out and "built in" in out
    assert main(["data", "info", "gaussian_mixture"]) == 0
    out = capsys.readouterr().out
    assert "train     1000 samples  input (32,)" in out and "classes (10)" in out


def test_cli_errors_and_help(capsys, tmp_path):
    assert main(["data", "info", "cifar10", "--root", str(tmp_path)]) == 2
    assert "error: dataset 'cifar10' not found" in capsys.readouterr().err
    assert main(["data", "download", "cifarr"]) == 2
    assert "Did you mean 'cifar10'" in capsys.readouterr().err
    assert main(["data", "download", "imagenet"]) == 1
    assert "image-net.org" in capsys.readouterr().out
    for command in (["data"], ["data", "list"], ["data", "info"], ["data", "download"]):
        with pytest.raises(SystemExit):
            main([*command, "--help"])
        assert "examples:" in capsys.readouterr().out
