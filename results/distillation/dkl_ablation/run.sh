#!/bin/bash
# The DKL paper's Table 1 ablation (KD task) at K = 10 and K = 100.
# Usage (repository root): RUNS=/path/to/runs bash results/distillation/dkl_ablation/run.sh [WORKERS]
exec bash results/distillation/run_study.sh dkl_ablation "$@"
