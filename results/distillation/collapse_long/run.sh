#!/bin/bash
# DHKD App. A at the paper's lr 0.01 over 4,096 steps: does the official BinaryKL clamp fire, does one head collapse?
# Usage (repository root): RUNS=/path/to/runs SEEDS="0" bash results/distillation/collapse_long/run.sh [WORKERS]
exec bash results/distillation/run_study.sh collapse_long "$@"
