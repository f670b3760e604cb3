#!/bin/bash
# DHKD App. A, the rest of Tables 6-7: BinaryKL alone at large alpha, gradient clipping.
# Usage (repository root): RUNS=/path/to/runs SEEDS="0 1 2" bash results/distillation/collapse_clip/run.sh [WORKERS]
# (RUNS of ../collapse_grid gives it its CE-alone, BinaryKL-alone and CE + BinaryKL references without clipping.)
exec bash results/distillation/run_study.sh collapse_clip "$@"
