"""The run lifecycle of both tasks: :class:`RunEngine`, the base of the image ``Trainer`` and the language-model
``LMTrainer`` (torchtune's recipe over shared checkpointer and metric-logger components; Lightning's fit loop
around a module's hooks).

What a run does to its directory, in this order, is written once here:

1. ``resume`` with ``overwrite`` is refused;
2. the task's ``setup_environment`` (process group, device, precision);
3. ``claim_run_dir``: the lock, the checks of what the directory holds, on resume the repair of a commit torn by a
   crash. Nothing but the lock file changes;
4. the task's ``setup`` (its ``setup_*`` steps and, on resume, the restore of the last commit), which returns the
   first unit (epoch or step) still to train;
5. ``start_run_dir``: from here the directory is the run's (an overwritten run cleared, ``config.yaml`` and
   ``run.json`` written); then the metrics log (truncated to the last commit, TensorBoard, the trackers) and the
   task's facts added to ``run.json`` (:meth:`RunEngine.execution`).

A failure in 2–5 releases the directory as it was (a refused command leaves no lock file and no folder).
:meth:`RunEngine.run` trains (the task's ``train``), then closes the log (the trackers' runs as failed when an
error ended it) and releases the lock, whatever happened. :meth:`RunEngine.commit` is the one way a unit reaches
the disk: the main process writes its weight files and the log's records in one ``state.json`` commit
(``RunDir.commit``, which first checks that the lock is still this process's), then the records go to
TensorBoard and the trackers.

What stays the task's: what is set up, how one unit trains, what a commit's files hold (an image run's
``method.``/``extra.``/``ema.`` tensors and its model files; an LM run's ``student.`` tensors) and how a resume
reads them back.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from tqdm import tqdm

from kdcollapse.config import RunConfig
from kdcollapse.config_lm import LMConfig
from kdcollapse.distributed import DistEnv
from kdcollapse.errors import CheckpointError, ConfigError, KdcollapseError
from kdcollapse.runs import MetricsLog, RunDir, claim_run_dir, on_main_process, start_run_dir, update_run_record


class TrainingDiverged(KdcollapseError):
    """The loss, the weights or the evaluation became NaN or infinite."""


class RunEngine:
    """One run of a task into ``cfg.run_dir`` (module docstring). A task defines ``setup_environment`` (sets
    :attr:`dist`), ``setup(resume) -> first unit``, ``train()``, :meth:`execution` and :attr:`tensorboard`;
    :attr:`unit` names what one commit holds."""

    unit = "epoch"  # what one commit holds, in messages: "epoch" (image runs) or "step" (LM runs)
    dist: DistEnv
    log: MetricsLog
    run_files: RunDir | None

    def __init__(self, cfg: RunConfig | LMConfig, *, resume: bool = False, overwrite: bool = False):
        self.cfg, self.run_files, self.run_dir = cfg, None, Path(cfg.run_dir)
        if resume and overwrite:
            raise ConfigError("resume continues the run in run_dir and overwrite replaces it; give one of them")
        try:
            self.setup_environment()
            self.run_files = claim_run_dir(cfg, resume=resume, overwrite=overwrite, is_main=self.dist.is_main)
            start = self.setup(resume)
            self.committed = start  # the last committed unit, on every process
            start_run_dir(cfg, self.run_files)
            self.log = MetricsLog(self.run_dir, start_epoch=start, enabled=self.dist.is_main,
                                  tensorboard=self.tensorboard)
            if self.dist.is_main and (facts := self.execution()):
                update_run_record(self.run_dir, facts)
        except BaseException:
            self.release_run_dir()
            raise

    # ------------------------------------------------------------------------ the task's part
    def setup_environment(self) -> None:
        raise NotImplementedError

    def setup(self, resume: bool) -> int:
        """The task's ``setup_*`` steps (and on resume its restore); returns the first unit still to train."""
        raise NotImplementedError

    def train(self) -> Any:
        raise NotImplementedError

    def execution(self) -> dict:
        """Facts of what actually runs, added to ``run.json`` by the main process (nothing when empty)."""
        return {}

    @property
    def tensorboard(self) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------------------ the shared part
    def run(self) -> Any:
        failed = True
        try:
            result = self.train()
            failed = False
            return result
        finally:  # an error too ends the tracked runs, as failed (W&B's log of this segment is then complete)
            try:
                self.log.close(failed)
            finally:
                self.release_run_dir()

    def release_run_dir(self) -> None:
        if self.run_files is not None:
            self.run_files.release()

    def commit(self, unit: int, weight_files: Callable[[], dict]) -> None:
        """Commit ``unit`` (1-based): ``weight_files()`` (name -> ``(tensors, meta)``, called on the main process
        only) and the log's records in one step, then the records to TensorBoard and the trackers. A failed write
        (a full disk) commits nothing, and says what the directory still holds and how to go on."""
        def write() -> None:
            held = self.run_files.state["epoch"] if self.run_files.state else None  # the last commit
            try:
                self.run_files.commit(unit, weight_files(), self.log.files())
            except CheckpointError as err:
                if held is None:  # nothing to resume from
                    raise CheckpointError(f"{err}; nothing of {self.unit} {unit} was saved and {self.run_dir} holds "
                                          f"no committed {self.unit}: free space and run the same command again "
                                          "(without --resume)") from None
                raise CheckpointError(f"{err}; nothing of {self.unit} {unit} was saved and {self.run_dir} still "
                                      f"holds {self.unit} {held}: free space and resume it") from None

        on_main_process(self.dist.is_main, write, f"the main process could not save {self.unit} {unit}")
        self.committed = unit
        self.log.committed()  # TensorBoard and the trackers see only committed units

    def kept(self) -> str:
        """What the run directory holds after a failure now, and how to go on (for :class:`TrainingDiverged`)."""
        if self.committed:
            return f"the last good checkpoint (after {self.unit} {self.committed}) is kept in {self.run_dir}"
        return f"no {self.unit} had been committed, so the corrected command starts it again (without --resume)"

    def progress_bar(self, enabled: bool, **options: Any) -> tqdm:
        """A tqdm bar on the main process when ``enabled`` (``train.progress`` / ``progress``)."""
        return tqdm(disable=not (enabled and self.dist.is_main), dynamic_ncols=True, leave=False, **options)
