#!/bin/bash
# DKD's beta at K = 10 and K = 100, chosen on validation.
# Usage (repository root): RUNS=/path/to/runs bash results/distillation/dkd_beta/run.sh [WORKERS]
# Needs the teachers of results/distillation/collapse_k/run.sh in RUNS (teacher_k10, teacher_k100).
set -euo pipefail
RUNS=${RUNS:?set RUNS} WORKERS=${1:-2} SEEDS=${SEEDS:-"0 1 2"}
HERE=results/distillation/dkd_beta
export OMP_NUM_THREADS=1 PYTHONPATH=${PYTHONPATH:-$PWD/src}
PY=${PY:-python}
bash $HERE/jobs.sh "$RUNS" "$SEEDS" > $RUNS/dkd_jobs.txt
PY=$PY bash results/distillation/workers.sh $RUNS/dkd_jobs.txt $RUNS/dkd_worker $WORKERS
$PY $HERE/summarise.py $RUNS $HERE
