"""Bad input of every kind gives one clear error line before any work starts (issue 12, items 7-11)."""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import http.server
import os
import re
import struct
import threading
import time
import tracemalloc
import zlib
from pathlib import Path

import pytest
import yaml
from test_data import write_jpeg

from kdcollapse.cli import main
from kdcollapse.config import RunConfig, check_config, config_to_dict, load_config, save_config
from kdcollapse.data import download_file, load_dataset, make_loader
from kdcollapse.data._idx import read_idx
from kdcollapse.errors import ConfigError, DataError

# ---------------------------------------------------------------------------------------------------
# Config values are range-checked (item 7)
# ---------------------------------------------------------------------------------------------------

# One invalid value for every field of the run config (the `method:` section is checked by each method).
INVALID = {
    "run_dir": '""',
    "imports": '"notalist"',
    "seed": str(2**64),
    "data.name": "nope",
    "data.root": '""',
    "data.batch_size": "0",
    "data.eval_batch_size": "-1",
    "data.crop_padding": "-1",
    "data.flip": "maybe",
    "data.classes": "[]",
    "data.train_per_class": "0",
    "data.test_per_class": "0",
    "data.val_per_class": "-1",
    "data.num_workers": "-1",
    "model.name": "resnet",
    "model.num_classes": "0",
    "model.kwargs": "{1: 2}",
    "teacher.cache": "disk",
    "teacher.cache_topk": "0",
    "teacher.checkpoint": '""',
    "teacher.model": "nope",
    "teacher.weights": '""',
    "optim.lr": "-0.1",
    "optim.momentum": "1",
    "optim.nesterov": "maybe",
    "optim.weight_decay": "-0.5",
    "optim.grad_clip": "-1",
    "optim.name": "adamm",
    "optim.kwargs": "{1: 2}",
    "optim.accumulate": "0",
    "schedule.name": "step",
    "schedule.milestones": "[30, 20]",
    "schedule.gamma": "-1",
    "schedule.warmup_epochs": "-1",
    "schedule.min_lr": "-1",
    "schedule.kwargs": "[1]",
    "schedule.interval": "batch",
    "train.epochs": "0",
    "train.eval_every": "0",
    "train.label_smoothing": "2",
    "train.amp": "fp8",
    "train.channels_last": "maybe",
    "train.compile": "maybe",
    "train.deterministic": "maybe",
    "train.device": "tpu9",
    "train.progress": "maybe",
    "train.log_every": "0",
    "train.tensorboard": "maybe",
    "train.trackers": "neptune",
    "train.group": "[1, 2]",
    "train.ema": "1",
    "analysis.every": "-1",
    "analysis.train_per_class": "0",
}

# The further cases: values of the right type that are out of range, and ranges across fields.
FURTHER = [
    (["schedule.gamma=1e300"], "schedule.gamma must be in (0, 1], got 1e+300"),
    (["optim.lr=.nan"], "optim.lr must be >= 0, got nan"),
    (["optim.lr=.inf"], "optim.lr must be >= 0, got inf"),
    (["seed=-1"], "seed must be in [0, 2**64 - 1] (64 bits), got -1"),
    (["data.classes=[0, 3, 0]"], "data.classes must be a non-empty list of distinct class indices >= 0 or null"),
    (["data.classes=[-1]"], "data.classes must be"),
    (["train.device=cuda:x"], "train.device must be auto, cpu, cuda, cuda:N or mps, got 'cuda:x'"),
    (["model.name=resnet9"], "model.name: unknown model 'resnet9'. Did you mean 'resnet8'"),
    (["data.name=cifar11"], "data.name: unknown dataset 'cifar11'. Did you mean 'cifar10', 'cifar100'?"),
    (["optim.lr=0.1", "schedule.min_lr=0.2"], "schedule.min_lr=0.2, optim.lr=0.1: need schedule.min_lr <= optim.lr"),
    (["optim.momentum=0", "optim.nesterov=true"], "need optim.momentum > 0 when optim.nesterov is true"),
]


def leaf_keys(node, prefix: str = "") -> list[str]:
    keys = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if f.name == "method":
            continue
        keys += leaf_keys(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [prefix + f.name]
    return keys


def test_the_table_covers_every_field_and_the_defaults_are_valid():
    assert sorted(INVALID) == sorted(leaf_keys(RunConfig()))
    check_config(RunConfig())
    for key in ("train.device=cuda:1", "train.device=mps", "data.train_per_class=null", "schedule.milestones=[]",
                "schedule.gamma=1", "optim.momentum=0", "schedule.min_lr=0.05"):
        load_config(None, [key])  # edges of the ranges are valid


@pytest.mark.parametrize("key", sorted(INVALID))
def test_every_field_rejects_an_invalid_value(key):
    with pytest.raises(ConfigError) as err:
        load_config(None, [f"{key}={INVALID[key]}"])
    message = str(err.value)
    assert key in message and ("got" in message or "unknown" in message) and "\n" not in message, message
    assert INVALID[key].strip('"') in message, message  # the bad value


@pytest.mark.parametrize("overrides, message", FURTHER)
def test_out_of_range_values_and_relations(overrides, message):
    with pytest.raises(ConfigError) as err:
        load_config(None, overrides)
    assert message in str(err.value)


def test_the_yaml_file_is_checked_like_overrides(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  epochs: 0\n")
    with pytest.raises(ConfigError, match=r"train.epochs must be >= 1, got 0"):
        load_config(path)


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` with its bytes and modification time."""
    return {str(p.relative_to(folder)): (p.read_bytes(), p.stat().st_mtime_ns) for p in folder.rglob("*") if p.is_file()}


@pytest.mark.parametrize("command, key", [
    ("train", "train.epochs"), ("train", "optim.lr"), ("train", "train.device"), ("train", "seed"),
    ("distill", "schedule.gamma"), ("train", "data.train_per_class"), ("train", "train.eval_every"),
])  # fmt: skip
def test_the_cli_exits_2_with_one_line_and_touches_nothing(tmp_path, capsys, monkeypatch, command, key):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("{}\n")
    old = tmp_path / "old_run"
    old.mkdir()
    save_config(load_config(None, [f"run_dir={old}"]), old / "config.yaml")
    (old / "model.safetensors").write_bytes(b"weights of a week")
    before = snapshot(tmp_path)
    override = f"{key}={INVALID[key]}"
    attempts = (
        ["--config", "c.yaml", f"run_dir={tmp_path / 'new_run'}", override],
        ["--config", "c.yaml", f"run_dir={old}", "--overwrite", override],
        ["--resume", str(old), override],
    )
    for args in attempts:
        assert main([command, *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and f"{key}" in err, err
    assert snapshot(tmp_path) == before and sorted(os.listdir(tmp_path)) == ["c.yaml", "old_run"]


def test_every_seed_of_a_multi_seed_run_is_checked_before_the_first_run(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "c.yaml").write_text("{}\n")
    assert main(["train", "--config", "c.yaml", "--seeds", f"1,{2**64}", f"run_dir={tmp_path / 'runs'}"]) == 2
    assert capsys.readouterr().err == f"error: seed must be in [0, 2**64 - 1] (64 bits), got {2**64}\n"
    assert sorted(os.listdir(tmp_path)) == ["c.yaml"]


def test_config_files_that_cannot_be_read(tmp_path, capsys):
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes("run_dir: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"is not UTF-8 text \(invalid byte at offset 12\)"):
        load_config(latin1)
    broken = tmp_path / "broken.yaml"
    broken.write_text("optim: {lr: [1, 2}\n")
    for path in (latin1, broken):
        assert main(["train", "--config", str(path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: config file") and err.count("\n") == 1, err


def test_a_saved_config_loads_back_valid(tmp_path):
    cfg = load_config(None, ["data.train_per_class=5", "schedule.milestones=[2, 4]"])
    save_config(cfg, tmp_path / "c.yaml")
    assert config_to_dict(load_config(tmp_path / "c.yaml")) == yaml.safe_load((tmp_path / "c.yaml").read_text())


# ---------------------------------------------------------------------------------------------------
# image_folder: classes matched by name; bad images are one-line errors (items 8, 9)
# ---------------------------------------------------------------------------------------------------


def image_folder(root: Path, classes: dict[str, tuple[str, ...]]) -> Path:
    """``root/<split>/<class>/<i>.png`` (or ``.jpg``) for ``classes = {split: class names}``; returns root."""
    for split, names in classes.items():
        for c, name in enumerate(names):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(2):
                write_jpeg(root / split / name / f"{i}.{'png' if i else 'jpg'}", (12, 10), seed=10 * c + i)
    return root


def test_test_split_is_labelled_by_the_training_class_names(tmp_path):
    root = image_folder(tmp_path, {"train": ("ant", "bee", "cat"), "test": ("ant", "bee", "cat")})
    train = load_dataset("image_folder", "train", root=root, image_size=8)
    test = load_dataset("image_folder", "test", root=root, image_size=8)
    assert train.classes == test.classes == ["ant", "bee", "cat"]
    assert [(Path(p).parent.name, y) for p, y in test.samples] == [("ant", 0), ("ant", 0), ("bee", 1), ("bee", 1),
                                                                   ("cat", 2), ("cat", 2)]


@pytest.mark.parametrize("train, test, message", [
    (("ant", "bee", "cat"), ("ant", "cat"), r"test: class folders differ from the training split's: missing 1 \(bee\)$"),
    (("ant", "bee"), ("ant", "bee", "cow"), r"not in the training split 1 \(cow\)$"),
    (("ant", "bee"), ("bee", "cow"), r"missing 1 \(ant\); not in the training split 1 \(cow\)$"),
])  # fmt: skip
def test_class_mismatch_between_splits_is_an_error(tmp_path, train, test, message):
    root = image_folder(tmp_path, {"train": train, "test": test})
    load_dataset("image_folder", "train", root=root)
    with pytest.raises(DataError, match=message):
        load_dataset("image_folder", "test", root=root)


def test_empty_class_folders_are_an_error(tmp_path):
    root = image_folder(tmp_path, {"train": ("ant", "bee"), "val": ("ant", "bee")})
    for split in ("train", "val"):
        (root / split / "cow").mkdir()
        (root / split / "dog").mkdir()
        (root / split / "dog" / "notes.txt").write_text("no image here")
    with pytest.raises(DataError, match=r"train: class folders without images: 2 \(cow, dog\)$"):
        load_dataset("image_folder", "train", root=root)
    with pytest.raises(DataError, match=r"val: class folders without images: 2 \(cow, dog\)$"):
        load_dataset("image_folder", "test", root=root)


def test_imagenet_val_classes_are_matched_by_name_too(tmp_path):
    root = image_folder(tmp_path, {"train": ("n01", "n02"), "val": ("n01", "n03")})
    with pytest.raises(DataError, match=r"missing 1 \(n02\); not in the training split 1 \(n03\)"):
        load_dataset("imagenet", "test", root=root)


def png_bomb(path: Path, side: int = 100_000) -> Path:
    """A valid 1-bit PNG header announcing ``side`` x ``side`` pixels, with a tiny compressed body."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 1, 0, 0, 0, 0)
    body = zlib.compress(b"\0" * (side // 8 + 1) * 64)
    path.write_bytes(b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", body) + chunk(b"IEND", b""))
    return path


@pytest.mark.parametrize("workers", [0, 1])
@pytest.mark.parametrize("bad, message", [
    (lambda p: p.write_bytes(b"not a picture at all"), r"cannot decode image \(UnidentifiedImageError: "),
    (lambda p: p.write_bytes(p.read_bytes()[:-100]), r"cannot decode image \(OSError: ([Tt]runcated|image file is truncated)"),
    (png_bomb, r"refused as a possible decompression bomb \(Image size \(10000000000 pixels\) exceeds limit"),
])  # fmt: skip
def test_a_bad_image_is_one_line_naming_the_file(tmp_path, workers, bad, message):
    root = image_folder(tmp_path, {"train": ("ant", "bee")})
    path = root / "train" / "bee" / "0.jpg"
    bad(path)
    train = load_dataset("image_folder", "train", root=root, image_size=8)
    loader = make_loader(train, 2, train=False, device="cpu", seed=0, num_workers=workers)
    with pytest.raises(DataError) as err:
        list(loader)
    assert str(err.value).startswith(f"{path}: ") and "\n" not in str(err.value), str(err.value)
    assert re.search(message, str(err.value)), str(err.value)
    assert len(list(make_loader(train.subset(indices=[0, 1, 3]), 2, train=False, device="cpu", seed=0,
                                num_workers=workers))) == 2  # the good images still load


def test_a_freed_folder_loader_stops_its_workers_at_once(tmp_path):
    """Its worker processes end when the loader is freed (also after a decode error), not at a later garbage
    collection, which finalized the DataLoader's queues first and then waited out a 5 s timeout per worker (the
    22 s that test_distributed_teardown_waits_then_destroys_the_group_on_every_exit_path took in the suite)."""
    root = image_folder(tmp_path, {"train": ("ant", "bee")})
    train = load_dataset("image_folder", "train", root=root, image_size=8)
    workers = []
    for bad in (False, True):
        if bad:
            (root / "train" / "bee" / "0.jpg").write_bytes(b"garbage")
            train = load_dataset("image_folder", "train", root=root, image_size=8)
        loader = make_loader(train, 2, train=False, device="cpu", seed=0, num_workers=1)
        with pytest.raises(DataError) if bad else contextlib.nullcontext():
            list(loader)
        workers += loader._loader._iterator._workers
        del loader
    for worker in workers:
        worker.join(timeout=60)
    assert [w.exitcode for w in workers] == [0, 0]


@pytest.mark.slow
def test_training_on_an_undecodable_image_with_workers_is_one_error_line(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    image_folder(tmp_path / "data", {"train": ("ant", "bee"), "test": ("ant", "bee")})
    (tmp_path / "data" / "train" / "bee" / "1.png").write_bytes(b"garbage")
    (tmp_path / "c.yaml").write_text("{}\n")
    assert main(["train", "--config", "c.yaml", "data.name=image_folder", "data.root=data", "model.name=convnet_small",
                 "data.num_workers=1", "data.batch_size=2", "train.epochs=1", "train.progress=false"]) == 2
    err = capsys.readouterr().err
    assert err == ("error: data/train/bee/1.png: cannot decode image (UnidentifiedImageError: cannot identify image "
                   "file 'data/train/bee/1.png')\n")


# ---------------------------------------------------------------------------------------------------
# Downloads keep to the known size and a deadline; IDX reading is bounded by the header (item 10)
# ---------------------------------------------------------------------------------------------------


class _Hostile(http.server.BaseHTTPRequestHandler):
    """``/flood/N``: endless bytes (at most 64 MB), announcing ``N``, or nothing for ``N = 0``;
    ``/drip``: one byte every 50 ms (at most 5 s); ``/short/N``: ``N`` bytes, no length, then close."""

    sent: dict[str, int] = {}

    def do_GET(self):  # noqa: N802
        kind, _, arg = self.path.strip("/").partition("/")
        self.send_response(200)
        if kind == "flood" and int(arg):
            self.send_header("Content-Length", arg)
        self.end_headers()
        sent, chunk = 0, b"x" * (64 << 10) if kind == "flood" else b"x"
        limit = {"flood": 64 << 20, "drip": 100, "short": int(arg or 0)}[kind]
        try:
            while sent < limit:
                piece = chunk[: limit - sent]
                self.wfile.write(piece)
                self.wfile.flush()
                sent += len(piece)
                if kind == "drip":
                    time.sleep(0.05)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the client hung up, as it should
        self.sent[self.path] = sent

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def hostile():
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


ANY = "sha256:" + "0" * 64


@pytest.mark.parametrize("path, message", [
    ("/flood/200000000", "the server announces 200000000 bytes, expected 5000"),
    ("/flood/0", "the server sent more than the expected 5000 bytes"),
    ("/short/4000", "connection closed after 4000 of 5000 bytes"),
])  # fmt: skip
def test_downloads_stop_at_the_known_size(hostile, tmp_path, path, message):
    with pytest.raises(DataError, match=f"{path}: ConnectionError: {message}$"):
        download_file([hostile + path], tmp_path / "f.bin", ANY, size=5000, progress=False, timeout=5)
    assert list(tmp_path.iterdir()) == []
    _Hostile.sent.pop(path, None)


def test_a_flood_without_a_known_size_is_cut_off_early(hostile, tmp_path):
    with pytest.raises(DataError, match="sent more than the expected 5000 bytes"):
        download_file([hostile + "/flood/0"], tmp_path / "f.bin", ANY, size=5000, progress=False, timeout=5)
    deadline = time.monotonic() + 5
    while "/flood/0" not in _Hostile.sent and time.monotonic() < deadline:
        time.sleep(0.01)
    assert _Hostile.sent["/flood/0"] < 16 << 20  # what the socket buffers took before the hang-up, not 64 MB


def test_the_deadline_bounds_a_slow_server(hostile, tmp_path):
    start = time.monotonic()
    with pytest.raises(DataError, match=r"/drip: TimeoutError: deadline passed after \d+ of 100 bytes\n.*"
                                        r"/drip: not tried, the deadline of 0.3 s has passed"):
        download_file([hostile + "/drip", hostile + "/drip"], tmp_path / "f.bin", ANY, size=100, progress=False,
                      timeout=5, deadline=0.3)
    assert time.monotonic() - start < 2  # the whole drip would take 5 s
    assert list(tmp_path.iterdir()) == []


def test_stale_part_files_are_removed_and_live_ones_kept(hostile, tmp_path):
    import fcntl

    stale = tmp_path / ".f.bin.abc123.part"
    stale.write_bytes(b"left by kill -9")
    live = tmp_path / ".f.bin.def456.part"
    live.write_bytes(b"another process is writing")
    other = tmp_path / ".g.bin.abc123.part"
    other.write_bytes(b"another file's")
    with open(live, "rb") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # as the downloading process holds it
        with pytest.raises(DataError):
            download_file([hostile + "/short/10"], tmp_path / "f.bin", ANY, size=10, progress=False, timeout=5)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".f.bin.def456.part", ".g.bin.abc123.part"]


def gzip_bomb(path: Path, header: bytes, members: int) -> Path:
    """A valid IDX header followed by ``members`` gzip members of 64 MB of zeros each (~64 kB compressed)."""
    member = gzip.compress(bytes(64 << 20), compresslevel=9)
    with open(path, "wb") as f:
        f.write(gzip.compress(header))
        for _ in range(members):
            f.write(member)
    return path


def test_read_idx_stops_a_gzip_bomb_at_the_size_the_header_implies(tmp_path):
    header = bytes([0, 0, 0x08, 3]) + struct.pack(">III", 10, 28, 28)  # 7840 bytes of pixels
    path = gzip_bomb(tmp_path / "bomb-idx3-ubyte.gz", header, members=16)  # ~1 MB expanding to 1 GB
    assert path.stat().st_size < 2 << 20
    tracemalloc.start()
    try:
        with pytest.raises(DataError, match=r"has trailing bytes: more than the 7856 bytes the header \(10, 28, 28\)"):
            read_idx(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, peak  # the whole expansion would be 1 GB


def test_read_idx_refuses_a_header_implying_too_much(tmp_path):
    path = tmp_path / "huge-idx3-ubyte"
    path.write_bytes(bytes([0, 0, 0x08, 3]) + struct.pack(">III", 2**20, 2**10, 2**10) + b"\0" * 10)
    with pytest.raises(DataError, match=r"the header \(1048576, 1024, 1024\) implies 1099511627776 bytes, more "
                                        r"than the limit of 4294967296"):
        read_idx(path)


# ---------------------------------------------------------------------------------------------------
# Leaving the process group (item 11; the multi-process tests themselves use distributed_teardown)
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("fail", [False, True])
def test_distributed_teardown_waits_then_destroys_the_group_on_every_exit_path(tmp_path, monkeypatch, fail):
    """Normal exit: a barrier, then destroy. On an error: a barrier bounded by FAILURE_WAIT, then destroy."""
    import torch
    import torch.distributed as dist

    from kdcollapse.distributed import FAILURE_WAIT, distributed_teardown

    calls = []
    for name in ("barrier", "monitored_barrier", "destroy_process_group"):
        real = getattr(dist, name)
        monkeypatch.setattr(dist, name, lambda *a, real=real, name=name, **kw: calls.append((name, kw)) or real(*a, **kw))
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        with pytest.raises(DataError) if fail else contextlib.nullcontext(), distributed_teardown():
            dist.all_reduce(torch.ones(1))
            if fail:
                raise DataError("this rank failed")
        assert not dist.is_initialized()
        wait = ("monitored_barrier", {"timeout": FAILURE_WAIT}) if fail else ("barrier", {})
        assert calls == [wait, ("destroy_process_group", {})]
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
