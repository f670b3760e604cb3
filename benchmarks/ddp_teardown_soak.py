"""Run multi-process tests many times in a row and count how often each fails (not part of the suite).

    python benchmarks/ddp_teardown_soak.py --runs 200 tests/test_methods.py::test_ddp_two_processes_align_the_global_batch_gradients

Each test is parametrised ``--runs`` times (as pytest-repeat does) and run consecutively in one pytest
session (fresh ``tmp_path`` every time; every run starts its own worker processes, so every run exercises the
process-group teardown). Prints one line per node id: runs, failures, and how many failures mention
SIGABRT or "terminate called", then the first failure's last lines.
"""

from __future__ import annotations

import argparse
import collections
import re
import sys
import time

import pytest


class Repeat:
    """A pytest plugin: every collected test runs ``runs`` times; outcomes are tallied per node id."""

    def __init__(self, runs: int, log: str | None):
        self.runs, self.log = runs, log
        self.outcomes: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.first_failure: dict[str, str] = {}

    @pytest.fixture
    def soak_run(self, request):
        return request.param

    def pytest_generate_tests(self, metafunc):
        metafunc.fixturenames.append("soak_run")
        metafunc.parametrize("soak_run", range(self.runs), indirect=True, ids=lambda i: f"soak{i}")

    def pytest_runtest_logreport(self, report):
        if report.when != "call" and report.passed:
            return
        node = re.sub(r"-?soak\d+", "", report.nodeid).replace("[]", "")
        counts = self.outcomes[node]
        if report.when == "call" or report.failed:
            counts[report.outcome] += 1
        abort = False
        if report.failed:
            text = str(report.longrepr)
            abort = "SIGABRT" in text or "terminate called" in text
            counts["abort"] += abort
            self.first_failure.setdefault(report.nodeid, text[-1500:])
        if self.log:  # one line per run, so that the counts survive a soak that is stopped early
            with open(self.log, "a") as f:
                f.write(f"{node} {report.when} {report.outcome}{' abort' if abort else ''}\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--log", help="append one line per run to this file")
    parser.add_argument("node_ids", nargs="+")
    args = parser.parse_args()
    plugin = Repeat(args.runs, args.log)
    start = time.perf_counter()
    pytest.main(["-q", "-p", "no:cacheprovider", "--no-header", "-rN", *args.node_ids], plugins=[plugin])
    minutes = (time.perf_counter() - start) / 60
    print(f"\n{args.runs} runs per test, {minutes:.1f} min in all")
    for node, counts in plugin.outcomes.items():
        print(f"{node}: {counts['passed'] + counts['failed']} runs, {counts['failed']} failed "
              f"({counts['abort']} with SIGABRT / 'terminate called')")
    for node, text in plugin.first_failure.items():
        print(f"\nfirst failure of {node}:\n{text}")
    return 0 if not plugin.first_failure else 1


if __name__ == "__main__":
    sys.exit(main())
