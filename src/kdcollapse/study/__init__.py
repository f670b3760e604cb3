"""Studies: one YAML file names a grid of runs (overrides × seeds, teachers before students), their post-run
steps and the summary; ``kdcollapse study run | status | report`` run it here (a process pool) or on SLURM
(submitit), and write the page's tables and verdicts. See docs/studies.md."""

from kdcollapse.study._execute import OUTCOMES, Outcome, execute, pending, recorded, run_local, status
from kdcollapse.study._figures import figures
from kdcollapse.study._lock import launch_lock, page_lock
from kdcollapse.study._page import BEGIN, END, summarise, write_page
from kdcollapse.study._records import collect, run_record
from kdcollapse.study._runs import PostStep, RunSpec, run_config, state_of
from kdcollapse.study._slurm import array_parameters, levels, slurm_available, submit_slurm
from kdcollapse.study._spec import Study, load_study
from kdcollapse.study._summary_spec import check_summary

__all__ = ["BEGIN", "END", "OUTCOMES", "Outcome", "PostStep", "RunSpec", "Study", "check_summary", "collect",
           "execute", "figures", "launch_lock", "levels", "load_study", "page_lock", "pending", "recorded", "run_config",
           "run_local", "run_record", "array_parameters", "slurm_available", "state_of", "status", "submit_slurm",
           "summarise", "write_page"]
