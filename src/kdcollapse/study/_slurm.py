"""The SLURM executor, through submitit: one job array per (dependency level, group) with the group's
resources, each level's arrays held until the arrays of the level before end (``afterany``: a student whose
teacher failed ends as "blocked", it does not wait forever), and requeue on preemption or time-out.

A requeued job calls :func:`execute` again, which resumes the run from its last committed epoch: the random
state is a function of (seed, epoch), so the resumed run is bit for bit the one that never stopped.
A group with ``resources: {tasks: N, gpus: N}`` runs N tasks per job; each exports the torchrun variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) before training, so the run is the DDP run that
``torchrun --nproc-per-node N`` would start.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from kdcollapse._optional import require
from kdcollapse.errors import ConfigError
from kdcollapse.study._execute import Outcome, execute
from kdcollapse.study._runs import RunSpec
from kdcollapse.study._spec import Study


def slurm_available() -> str | None:
    """None when ``sbatch`` can be called; otherwise why not."""
    if shutil.which("sbatch") is None:
        return "no sbatch on PATH (install slurm-wlm, or start the one-node cluster of .ci/slurm.sh)"
    return None


def _job_class():
    submitit = require("submitit", "the SLURM executor")

    class StudyJob(submitit.helpers.Checkpointable):
        """A run as a SLURM task; submitit requeues it (same arguments) on preemption or time-out."""

        def __call__(self, run: RunSpec, threads: int | None) -> Outcome:
            if int(run.resources.get("tasks", 1)) > 1:
                submitit.helpers.TorchDistributedEnvironment().export(set_cuda_visible_devices=False)
            return execute(run, threads)

    return submitit, StudyJob


def levels(study: Study, runs: list[RunSpec]) -> list[list[RunSpec]]:
    """``runs`` by dependency depth within this launch: level 0 needs nothing that is still to run."""
    names, depth = {r.name for r in runs}, {}
    for run in runs:  # file order: a teacher comes before its students
        depth[run.name] = depth[run.teacher] + 1 if run.teacher in names else 0
    return [[r for r in runs if depth[r.name] == d] for d in range(max(depth.values(), default=-1) + 1)]


def array_parameters(name: str, res: dict, *, partition: str | None = None, parallel: int = 64,
                     after: list[str] = ()) -> dict:
    """submitit's parameters of one group's job array from its ``resources``: each array task is one run with
    ``tasks`` processes (1 by default), ``cpus`` CPUs per process and ``gpus`` GPUs on its node
    (``--gpus-per-node``): ``{gpus: 1}`` is one run per GPU, ``{tasks: N, gpus: N}`` one N-GPU DDP run. ``after``:
    the job ids this array waits for (``afterany``)."""
    params = {"timeout_min": int(res.get("minutes", 60)), "cpus_per_task": int(res.get("cpus", 1)),
              "tasks_per_node": int(res.get("tasks", 1)), "slurm_array_parallelism": parallel,
              "name": name, "slurm_additional_parameters": {}}
    if res.get("gpus"):
        params["gpus_per_node"] = int(res["gpus"])
    if res.get("mem_gb"):
        params["mem_gb"] = float(res["mem_gb"])
    if res.get("partition") or partition:
        params["slurm_partition"] = res.get("partition") or partition
    if after:
        params["slurm_additional_parameters"]["dependency"] = "afterany:" + ":".join(after)
    return params


def submit_slurm(study: Study, runs: list[RunSpec], folder: Path, *, partition: str | None = None,
                 threads: int | None = None, parallel: int = 64) -> list:
    """Submit ``runs``; returns the submitit jobs (``job.result()`` is the run's :class:`Outcome`)."""
    why = slurm_available()
    if why:
        raise ConfigError(f"cannot use the SLURM executor: {why}")
    submitit, job_class = _job_class()
    executor = submitit.AutoExecutor(folder=str(folder / "%j"), cluster="slurm")
    jobs, previous = [], []
    for level in levels(study, runs):
        current = []
        for group in dict.fromkeys(r.group for r in level):
            batch = [r for r in level if r.group == group]
            params = array_parameters(f"{study.name}:{group}", batch[0].resources, partition=partition,
                                      parallel=parallel, after=previous)
            executor.update_parameters(**params)
            array = executor.map_array(job_class(), batch, [threads or batch[0].resources.get("threads")] * len(batch))
            jobs += array
            current.append(array[0].job_id.split("_")[0])
        previous = current
    return jobs
