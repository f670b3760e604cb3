"""A full disk for real (issue 42): a resume run in a process whose files may not grow past a limit
(``RLIMIT_FSIZE``, SIGXFSZ ignored, so a write past it fails with EFBIG as on a full file system) after a
committed epoch. The process ends with one ``error:`` line, the committed epoch stays as it was, and a later
resume continues bit-identically to an uninterrupted run."""

import resource
import signal
from pathlib import Path

from test_faults import assert_same_run, files, resume, tiny
from kdcollapse.train import fit


def _limited_child(args, stderr, size):
    """``kdcollapse ARGS`` in a forked child (tests/ranks.py) whose files may not grow past ``size`` bytes: the
    limit and SIGXFSZ ignored are set around the fork and restored in this process at once."""
    from ranks import Forked

    old_limit, old_handler = resource.getrlimit(resource.RLIMIT_FSIZE), signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, old_limit[1]))
    try:
        return Forked(args, stderr)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_a_file_size_limit_after_a_committed_epoch_is_one_line_and_the_run_resumes_exactly(tmp_path):
    straight = fit(tiny(tmp_path / "straight", "train.epochs=2")).run_dir
    run_dir = fit(tiny(tmp_path / "run", "train.epochs=1")).run_dir
    before = files(run_dir)
    size = min(p.stat().st_size for p in Path(run_dir).glob("*.safetensors"))  # no weight file fits
    child = _limited_child(["train", "--resume", str(run_dir), "train.epochs=2"], tmp_path / "err", size // 2)
    child.wait()
    lines = [line for line in child.stderr().splitlines() if not line.startswith("epoch ")]
    assert child.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), child.stderr()[-2000:]
    assert "File too large" in lines[0] and "nothing of epoch 2 was saved" in lines[0], lines[0]
    after = files(run_dir)  # the resume's config (train.epochs) and its SHA-256 in run.json come first
    assert {k: v for k, v in after.items() if k not in ("config.yaml", "run.json")} == \
           {k: v for k, v in before.items() if k not in ("config.yaml", "run.json")}
    resume(run_dir, 2)
    assert_same_run(straight, run_dir, 2)
