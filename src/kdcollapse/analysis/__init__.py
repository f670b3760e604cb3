"""Collapse analysis of trained models: one pass over a split, a report with figures, per-epoch curves.

``analyze(subject, out_dir)`` measures every collapse metric of ``kdcollapse.metrics`` on a model's
penultimate features in one streaming pass, plus logit margins, a t-SNE of a feature sample (DHKD
App. G) and, with a teacher, the teacher-minus-student class logit matrices of every head (DHKD App. H).
``load_run`` / ``load_weights`` build the subject; ``epoch_collapse_metrics`` is the trainer's
``analysis.every`` hook. See docs/analysis.md.
"""

from kdcollapse.analysis._analyze import MEANINGS, AnalyzeOptions, analyze, markdown_report, meaning, tsne
from kdcollapse.analysis._epoch import EPOCH_KEYS, analysis_due, epoch_collapse_metrics
from kdcollapse.analysis._logits import ClassLogitMatrix, logit_margins, logit_matrix_difference, off_diagonal_mean_abs
from kdcollapse.analysis._plots import plot_logit_matrices, plot_margins, plot_spectra, plot_tsne
from kdcollapse.analysis._pass import SplitPass, classifier_weight, feature_pass, split_metrics
from kdcollapse.analysis._sample import ClassReservoir
from kdcollapse.analysis._source import Subject, load_run, load_weights

__all__ = [
    "EPOCH_KEYS",
    "MEANINGS",
    "AnalyzeOptions",
    "ClassLogitMatrix",
    "ClassReservoir",
    "SplitPass",
    "Subject",
    "analysis_due",
    "analyze",
    "classifier_weight",
    "epoch_collapse_metrics",
    "feature_pass",
    "load_run",
    "load_weights",
    "logit_margins",
    "logit_matrix_difference",
    "markdown_report",
    "meaning",
    "off_diagonal_mean_abs",
    "plot_logit_matrices",
    "plot_margins",
    "plot_spectra",
    "plot_tsne",
    "split_metrics",
    "tsne",
]
