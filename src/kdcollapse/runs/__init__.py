"""Run directories: their files (``config.yaml``, ``run.json``, ``metrics.jsonl``, safetensors checkpoints)
and ``Run``, which opens one and gives back its config, its data exactly as training saw it, its model,
teacher and extra heads. The trainer, ``analyze``, ``robust-eval``, the reports and the demo all go through
here. See docs/training.md."""

from kdcollapse.runs._checkpoint import load_tensors, read_header, save_model, save_tensors
from kdcollapse.runs._checkpoint import (check_checkpoint_meta, flatten_optimizer, load_state, model_file, model_meta,
                                         read_extra_heads, split_prefix, unflatten_optimizer)
from kdcollapse.runs._load import check_inputs, load_model, load_teacher
from kdcollapse.runs._community import archive_teachers, convert_archive, convert_weights
from kdcollapse.runs._data import UserData, check_split, run_dataset, run_splits
from kdcollapse.runs._run import RUN_STATES, Run, run_state
from kdcollapse.runs._metrics_log import MetricsLog, metrics_csv, read_committed_metrics, read_metrics
from kdcollapse.runs._record import check_config_unedited, provenance, update_run_record
from kdcollapse.runs._run_dir import (RESUMABLE_KEYS, RunDir, check_run_dirs, check_same_config, claim_run_dir,
                                     on_main_process, start_run_dir)
from kdcollapse.runs._atomic import replacing, write_files, write_text
from kdcollapse.runs._commit import committed_path, file_digest
from kdcollapse.runs._lock import RunLock

__all__ = ["RESUMABLE_KEYS", "MetricsLog", "Run", "RunDir", "RUN_STATES", "run_state", "UserData", "check_inputs",
           "check_run_dirs", "check_same_config", "check_split", "claim_run_dir",
           "convert_weights", "convert_archive", "archive_teachers", "load_model", "load_teacher", "load_tensors",
           "metrics_csv", "read_committed_metrics", "read_metrics", "run_dataset", "run_splits", "save_model",
           "save_tensors", "start_run_dir",
           "update_run_record", "provenance"]
__all__ += ["check_checkpoint_meta", "flatten_optimizer", "load_state", "model_file", "model_meta", "on_main_process",
            "read_extra_heads", "read_header", "split_prefix", "unflatten_optimizer", "check_config_unedited"]  # the checkpoint format, for the trainer's checkpointer
__all__ += ["RunLock", "committed_path", "file_digest", "replacing", "write_files", "write_text"]  # derived outputs: atomic, locked, with provenance
from kdcollapse.runs._derived import (containing_run, figure_source, lm_source, metrics_source, outputs_stale, read_outputs,
                                      read_robust_eval, record_outputs, run_lock_for, save_figure, seal_problem, sealed,
                                      source_of, stale_reason)
from kdcollapse.runs._derived import CONTENT_KEY

__all__ += ["CONTENT_KEY", "containing_run", "figure_source", "metrics_source", "outputs_stale", "read_outputs", "read_robust_eval",
            "lm_source", "record_outputs", "run_lock_for", "save_figure", "seal_problem", "sealed", "source_of", "stale_reason"]  # provenance of derived outputs: what they were computed from, and whether it still holds
