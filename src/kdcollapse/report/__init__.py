"""Figures and markdown reports shared by the demo, `kdcollapse plot` and `kdcollapse analyze`."""

from kdcollapse.report._curves import plot_curves
from kdcollapse.report._epochs import epoch_table, parse_epochs
from kdcollapse.report._markdown import markdown_table
from kdcollapse.report._pages import fill
from kdcollapse.report._panels import plot_panels
from kdcollapse.report._stats import (VERDICTS, holm, mean_difference_ci, mean_std, paired_t_test, partial_spearman,
                                     pearson, spearman, verdict)
from kdcollapse.report._tables import (comparisons_table, corrected_verdicts, paired_comparisons, rank_correlations,
                                      rank_correlations_table, seeds_cell, seeds_table)

__all__ = ["VERDICTS", "comparisons_table", "corrected_verdicts", "epoch_table", "fill", "holm",
           "markdown_table", "mean_difference_ci", "mean_std", "paired_comparisons", "paired_t_test", "parse_epochs",
           "partial_spearman", "pearson", "plot_curves", "plot_panels", "rank_correlations", "rank_correlations_table",
           "seeds_cell", "seeds_table", "spearman", "verdict"]
