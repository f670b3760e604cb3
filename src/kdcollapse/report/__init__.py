"""Figures and markdown reports shared by the demo, `kdcollapse plot` and `kdcollapse analyze`."""

from kdcollapse.report._curves import plot_curves
from kdcollapse.report._markdown import markdown_table

__all__ = ["markdown_table", "plot_curves"]
