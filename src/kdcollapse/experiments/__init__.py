"""Experiments built on the library: the robust-evaluation runner (``robust_eval``), unconstrained-features
model experiments (``ufm``, ``ufm_report``), the spherical-heads report (``heads_report``) and the demo
(``demo``), and their figures (``plots``). Import the module you need; this package imports nothing itself, so that plotting libraries
load only with the experiment that draws."""
