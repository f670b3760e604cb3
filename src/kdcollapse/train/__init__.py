"""Training: ``fit(cfg)`` runs any method; checkpoints and model files are safetensors + JSON."""

from kdcollapse.train._checkpoint import load_model, load_tensors, save_model, save_tensors
from kdcollapse.train._run_dir import read_metrics
from kdcollapse.train._trainer import RunResult, Trainer, TrainingDiverged, fit, learning_rate

__all__ = ["RunResult", "Trainer", "TrainingDiverged", "fit", "learning_rate", "load_model", "load_tensors",
           "read_metrics", "save_model", "save_tensors"]
