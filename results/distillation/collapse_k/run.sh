#!/bin/bash
# DHKD App. A (Tables 6-7) at K = 10 and K = 100: does CE + BinaryKL on one head collapse, and why?
# Usage (repository root): RUNS=/path/to/runs bash results/distillation/collapse_k/run.sh [WORKERS]
exec bash results/distillation/run_study.sh collapse_k "$@"
