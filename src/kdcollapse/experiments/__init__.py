"""Experiments built on the library: the robust-evaluation runner (``robust_eval``), unconstrained-features
model experiments (``ufm``, ``ufm_report``), the intra-class theorems (``intra_class_theory``), the measurements of
the GNC network experiments (``gnc_networks``) and of the VCI transfer experiment (``vci_transfer``), both study
post steps, and the demo (``demo``), and their figures (``plots``). Import the module you need; this package imports nothing itself, so that plotting libraries
load only with the experiment that draws."""
