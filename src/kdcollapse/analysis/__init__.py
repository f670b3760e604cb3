"""Collapse analysis of trained models: one pass over a split, a report with figures, per-epoch curves.

``analyze(subject, out_dir)`` measures every collapse metric of ``kdcollapse.metrics`` on a model's
penultimate features in one streaming pass, plus logit margins, a t-SNE of a feature sample (DHKD
App. G) and, with a teacher, the teacher-minus-student class logit matrices of every head (DHKD App. H).
``load_run`` / ``load_weights`` build the subject; ``epoch_collapse_metrics`` is the trainer's
``analysis.every`` hook. See docs/analysis.md.
"""

import importlib

# Each public name and the module that defines it. The package loads a module on first use of one of its
# names (PEP 562), so importing ``kdcollapse.analysis._options`` (the command line's --help does) does not
# load torchmetrics and matplotlib.
_HOME = {
    "_against": ("analyze_against", "geometry_pass", "markdown_against"),
    "_analyze": ("MEANINGS", "analyze", "markdown_report", "meaning", "tsne"),
    "_epoch": ("EPOCH_KEYS", "analysis_due", "epoch_collapse_metrics"),
    "_logits": ("ClassLogitMatrix", "logit_margins", "logit_matrix_difference", "off_diagonal_mean_abs"),
    "_options": ("AnalyzeOptions",),
    "_plots": ("plot_logit_matrices", "plot_margins", "plot_spectra", "plot_token_layers", "plot_tsne"),
    "_pass": ("SplitPass", "classifier_weight", "feature_pass", "split_metrics", "user_split"),
    "_sample": ("ClassReservoir",),
    "_source": ("Subject", "load_run", "load_weights"),
    "_stages": ("parse_stages", "pooled", "resolve_stages", "stage_forward"),
    "_token_against": ("analyze_tokens_against", "markdown_tokens_against", "token_geometry_pass"),
    "_token_report": ("load_token_spec", "token_report", "token_report_text"),
    "_tokens": ("NCC_CACHE_BYTES", "NccCache", "TokenClasses", "analyze_tokens", "ncc_pass", "next_token_targets",
                "resolve_layers", "token_batches", "token_classes", "token_pass"),
}
_MODULE_OF = {name: module for module, names in _HOME.items() for name in names}


def __getattr__(name: str):
    if name not in _MODULE_OF:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_MODULE_OF[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_MODULE_OF])


__all__ = sorted(_MODULE_OF)
