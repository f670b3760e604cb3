"""Studies: one YAML file names a grid of runs (overrides × seeds, teachers before students), their post-run
steps and the summary; ``kdcollapse study run | status | report`` run it here (a process pool) or on SLURM
(submitit), and write the page's tables and verdicts. See docs/studies.md."""

from kdcollapse.study._execute import OUTCOMES, Outcome, execute, pending, run_config, run_local, state_of, status
from kdcollapse.study._slurm import levels, slurm_available, submit_slurm
from kdcollapse.study._spec import PostStep, RunSpec, Study, load_study
from kdcollapse.study._summary import BEGIN, END, check_summary, collect, figures, run_record, summarise, write_page

__all__ = ["BEGIN", "END", "OUTCOMES", "Outcome", "PostStep", "RunSpec", "Study", "check_summary", "collect",
           "execute", "figures", "levels", "load_study", "pending", "run_config", "run_local", "run_record", "slurm_available",
           "state_of", "status",
           "submit_slurm", "summarise", "write_page"]
