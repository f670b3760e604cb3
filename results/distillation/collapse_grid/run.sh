#!/bin/bash
# DHKD App. A: CE + BinaryKL on one head over alpha in {0.1, 0.3, 1, 3, 10, 30} and lr in {0.1, 0.05, 0.01}.
# Usage (repository root): RUNS=/path/to/runs SEEDS="0" bash results/distillation/collapse_grid/run.sh [WORKERS]
exec bash results/distillation/run_study.sh collapse_grid "$@"
