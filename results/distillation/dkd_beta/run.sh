#!/bin/bash
# DKD's beta at K = 10 and K = 100, chosen on validation.
# Usage (repository root): RUNS=/path/to/runs bash results/distillation/dkd_beta/run.sh [WORKERS]
exec bash results/distillation/run_study.sh dkd_beta "$@"
