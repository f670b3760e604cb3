"""Training: ``fit(cfg)`` runs any method into a run directory (see :mod:`kdcollapse.runs` for its files)."""

from kdcollapse.train._lm import LMConfig, LMTrainer, distill_lm, load_lm_config, refuse_old_format, teacher_comparison
from kdcollapse.train._lm_cross import lm_task
from kdcollapse.train._lm_task import LMTask, cache_dir, top_k_costs
from kdcollapse.train._optim import learning_rate
from kdcollapse.train._trainer import RunResult, Trainer, TrainingDiverged, fit, seed_everything

__all__ = ["LMConfig", "LMTask", "LMTrainer", "cache_dir", "lm_task", "top_k_costs", "distill_lm", "refuse_old_format", "load_lm_config", "RunResult", "Trainer", "TrainingDiverged", "fit", "learning_rate", "seed_everything", "teacher_comparison"]
