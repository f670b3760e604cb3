"""``kdcollapse ARGS`` on several gloo ranks as ``torchrun --standalone`` starts them, each rank a fork of the
test process: the environment torchrun gives its workers (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT``) without the launcher's and each worker's own start
and import of torch, which cost seconds each. The launcher itself is tested by the real torchrun runs of
tests/test_train.py."""

from __future__ import annotations

import os
import signal
import socket
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class Finished:
    """What ``subprocess.run`` would say of a torchrun command: 0 when every rank returned 0; the ranks'
    stdout and stderr, rank by rank."""

    returncode: int
    stdout: str
    stderr: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(args: Sequence[str], *, world_size: int = 2, cwd: str | Path | None = None,
              timeout: float = 300) -> Finished:
    """Run ``kdcollapse.cli.main(args)`` on ``world_size`` forked ranks of one gloo group; see the module."""
    def cli() -> int:
        from kdcollapse.cli import main

        return main(list(args))

    return run_on_ranks(cli, world_size=world_size, cwd=cwd, timeout=timeout)


def run_on_ranks(target: Callable[[], int | None], *, world_size: int = 2, cwd: str | Path | None = None,
                 timeout: float = 300) -> Finished:
    """Run ``target()`` (its return value the exit code; None is 0) on ``world_size`` forked ranks, each with
    torchrun's environment: a part of a distributed run tested without the CLI."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        outputs = Path(tmp)
        pids = []
        for rank in range(world_size):
            pid = os.fork()
            if pid == 0:  # the rank: never returns
                _rank(rank, world_size, port, target, cwd, outputs)
            pids.append(pid)
        codes = _wait(pids, time.monotonic() + timeout)
        read = [(outputs / f"{r}.out").read_text() for r in range(world_size)]
        errors = [(outputs / f"{r}.err").read_text() for r in range(world_size)]
    return Finished(0 if not any(codes) else 1, "".join(read), "".join(errors))


def _rank(rank: int, world_size: int, port: int, target: Callable[[], int | None], cwd, outputs: Path) -> None:
    code = 1
    try:
        out, err = open(outputs / f"{rank}.out", "w"), open(outputs / f"{rank}.err", "w")
        os.dup2(out.fileno(), 1)
        os.dup2(err.fileno(), 2)
        sys.stdout, sys.stderr = out, err
        os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                          LOCAL_WORLD_SIZE=str(world_size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                          OMP_NUM_THREADS="1")
        torch.set_num_threads(1)  # a forked process must not start OpenMP's thread pool
        if cwd is not None:
            os.chdir(cwd)
        code = target()
    except SystemExit as exit:
        code = exit.code if isinstance(exit.code, int) else 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            os._exit(code or 0)


def _wait(pids: list[int], deadline: float) -> list[int]:
    codes = {}
    while len(codes) < len(pids):
        for pid in pids:
            if pid not in codes:
                done, status = os.waitpid(pid, os.WNOHANG)
                if done:
                    codes[pid] = os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            for pid in set(pids) - set(codes):
                os.kill(pid, 9)
                os.waitpid(pid, 0)
            raise TimeoutError(f"the ranks did not finish in time (exit codes so far: {codes})")
        time.sleep(0.05)
    return [codes[pid] for pid in pids]


class Forked:
    """``kdcollapse ARGS`` (``kdcollapse.cli.main``) in one forked child of the test process, as
    ``subprocess.Popen([python, "-m", "kdcollapse", *ARGS])`` would run it but without the interpreter's start
    and import of torch: a real process that a test may stop (SIGSTOP) and kill (SIGKILL). Its stderr goes to
    the file ``stderr``, its stdout nowhere."""

    def __init__(self, args: Sequence[str], stderr: str | Path):
        self._stderr, self.returncode = Path(stderr), None
        self.pid = os.fork()
        if self.pid == 0:  # the child: never returns
            code = 1
            try:
                err, out = open(self._stderr, "w"), open(os.devnull, "w")  # noqa: SIM115 - closed by _exit
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.stdout, sys.stderr = out, err
                os.environ["OMP_NUM_THREADS"] = "1"
                torch.set_num_threads(1)  # a forked process must not start OpenMP's thread pool
                # Ctrl-C as a started interpreter has it: a test process launched in the background by a
                # non-interactive shell inherits SIGINT ignored, and a fork would keep that (a SIGINT test then
                # waited on a run of 100,000 epochs)
                signal.signal(signal.SIGINT, signal.default_int_handler)
                from kdcollapse.cli import main

                code = main(list(args))
            except SystemExit as exit:
                code = exit.code if isinstance(exit.code, int) else 1
            except BaseException:  # noqa: BLE001 - reported, and the child still ends in os._exit
                traceback.print_exc()
            finally:
                try:
                    sys.stderr.flush()
                finally:
                    os._exit(code or 0)

    def poll(self) -> int | None:
        """The exit code once the child ended (``-signal`` when a signal ended it), else None."""
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def wait(self, timeout: float = 300.0) -> int:
        """The exit code; a child still running after ``timeout`` seconds is killed (SIGKILL: -9), so a test
        that waits on a child that ignored its signal fails instead of hanging."""
        deadline = time.monotonic() + timeout
        while self.poll() is None and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode

    def stderr(self) -> str:
        return self._stderr.read_text() if self._stderr.exists() else ""
