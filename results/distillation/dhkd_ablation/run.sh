#!/bin/bash
# The DHKD ablation (paper Tables 5, 8-9, 12) at K = 10 and K = 100.
# Usage (repository root): RUNS=/path/to/runs bash results/distillation/dhkd_ablation/run.sh [WORKERS]
exec bash results/distillation/run_study.sh dhkd_ablation "$@"
