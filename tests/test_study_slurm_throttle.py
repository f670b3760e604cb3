"""`kdcollapse study run --executor slurm --workers N`: at most N jobs of each job array at a time (SLURM's
``%N`` array throttle, submitit's ``slurm_array_parallelism``). Checked on the parameters handed to submitit,
with submitit replaced by a recorder: no cluster needed (the real one is tests/test_study.py's SLURM test)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from kdcollapse.cli import main
from kdcollapse.study import _slurm
from test_study import tiny_study


class _Executor:
    """Records each array's parameters; its jobs are never run (the CLI is called with --no-wait)."""

    arrays: list[dict] = []

    def __init__(self, folder, cluster):
        assert cluster == "slurm"
        self.params: dict = {}

    def update_parameters(self, **params):
        self.params = dict(params)

    def map_array(self, fn, runs, threads):
        _Executor.arrays.append({**self.params, "runs": [r.name for r in runs]})
        n = len(_Executor.arrays)
        return [SimpleNamespace(job_id=f"{n}_{i}") for i in range(len(runs))]


@pytest.fixture
def recorded(monkeypatch):
    _Executor.arrays = []
    fake = SimpleNamespace(AutoExecutor=_Executor)
    monkeypatch.setattr(_slurm, "slurm_available", lambda: None)
    monkeypatch.setattr(_slurm, "_job_class", lambda: (fake, object))
    return _Executor.arrays


@pytest.mark.parametrize("args, parallel", [([], 64), (["--workers", "1"], 1), (["--workers", "3"], 3)])
def test_slurm_workers_throttle_every_array(tmp_path, recorded, capsys, args, parallel):
    path = tiny_study(tmp_path)
    code = main(["study", "run", str(path), "--executor", "slurm", "--no-wait", "--runs-dir", str(tmp_path / "runs"),
                 *args])
    assert code == 0
    assert "submitted 5 jobs: arrays 1, 2" in capsys.readouterr().out
    assert [a["runs"] for a in recorded] == [["teacher"], ["kd/t2/seed0", "kd/t4/seed0", "kd/t2/seed1", "kd/t4/seed1"]]
    assert [a["slurm_array_parallelism"] for a in recorded] == [parallel, parallel]
    assert "dependency" not in recorded[0]["slurm_additional_parameters"]
    assert recorded[1]["slurm_additional_parameters"]["dependency"] == "afterany:1"
